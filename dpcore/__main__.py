"""``python -m dpcore <command>``."""
from .cli import main

raise SystemExit(main())
