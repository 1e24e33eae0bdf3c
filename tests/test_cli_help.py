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
