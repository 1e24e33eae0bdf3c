"""``python -m dpcore <command>``."""
from dpcore.cli import main

raise SystemExit(main())
