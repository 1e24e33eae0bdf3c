"""``python -m dpcore <command>``."""
from dpcore.cli import run_cli

raise SystemExit(run_cli())
