"""The CLI's help: every option of every command says what it does."""
from __future__ import annotations

import argparse

import pytest


def test_every_allreduce_option_has_help(capsys: pytest.CaptureFixture) -> None:
    from dpcore.cli import build_parser, main

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = [a for a in sub.choices["allreduce"]._actions if a.option_strings and a.dest != "help"]
    assert options and all(a.help and a.help.strip() for a in options), [a.dest for a in options if not a.help]
    with pytest.raises(SystemExit):
        main(["allreduce", "--help"])
    out = capsys.readouterr().out
    assert all(a.option_strings[0] in out for a in options) and "#wrong" in out


def _options_with_defaults() -> list[tuple[str, argparse.Action]]:
    from dpcore.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(name, a) for name, p in sub.choices.items() for a in p._actions
            if a.option_strings and a.dest != "help" and not isinstance(a, argparse._StoreTrueAction)
            and a.default is not None]


def test_every_option_with_a_default_says_it() -> None:
    found = _options_with_defaults()
    assert len(found) > 30
    silent = [f"{name} {a.option_strings[0]}" for name, a in found if "default" not in (a.help or "")]
    assert not silent, silent


def test_profile_help_lists_the_valid_values_and_defaults() -> None:
    import subprocess
    import sys

    from dpcore.contract.config import VARIANTS

    out = subprocess.run([sys.executable, "-m", "dpcore", "profile", "--help"], capture_output=True, text=True,
                         timeout=120).stdout
    flat = " ".join(out.split())  # argparse wraps the help text
    assert out.startswith("usage: python -m dpcore profile")
    assert all(f" {v}," in flat or f" {v} " in flat for v in VARIANTS)
    for option, default in (("--variants VARIANTS", "all"), ("--world-sizes WORLD_SIZES", "1,2"),
                            ("--warmup WARMUP", "3"), ("--bucket-mb BUCKET_MB", "25"),
                            ("--profile-steps PROFILE_STEPS", "3")):
        text = flat[flat.rindex(option):]
        assert f"(default {default})" in text[:400], (option, text[:400])


def test_usage_names_the_command_as_it_was_invoked() -> None:
    import subprocess
    import sys

    as_module = subprocess.run([sys.executable, "-m", "dpcore", "--help"], capture_output=True, text=True,
                               timeout=120).stdout
    assert as_module.startswith("usage: python -m dpcore ")
    # the console script (pyproject's [project.scripts] dpcore = dpcore.cli:run_cli)
    script = ("import sys; sys.argv[0] = '/venv/bin/dpcore'; from dpcore.cli import run_cli; "
              "raise SystemExit(run_cli())")
    as_script = subprocess.run([sys.executable, "-c", script, "--help"], capture_output=True, text=True,
                               timeout=120).stdout
    assert as_script.startswith("usage: dpcore ") and "python -m" not in as_script.splitlines()[0]
