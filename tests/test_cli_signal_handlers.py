"""``dpcore.cli.main`` takes SIGTERM for the command it runs and gives the caller's handler back
when the command returns: an in-process caller (a test, a notebook) must not be left with a
handler that raises KeyboardInterrupt where no command runs."""
from __future__ import annotations

import signal

import pytest

from dpcore.cli import main


def _mine(signum: int, frame: object) -> None:
    """The caller's own SIGTERM handler (never called here)."""


@pytest.mark.parametrize("argv", [["profile", "--variants", "nope"], ["analyze", ""], ["--version"]])
def test_main_gives_the_callers_sigterm_handler_back(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    signal.signal(signal.SIGTERM, _mine)
    before_int = signal.getsignal(signal.SIGINT)
    try:
        main(argv)
    except SystemExit:  # argparse's --version
        pass
    assert signal.getsignal(signal.SIGTERM) is _mine
    assert signal.getsignal(signal.SIGINT) is before_int


def test_sigterm_while_the_command_runs_interrupts_it(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    """Inside the command SIGTERM is an interrupt (exit 130), and the handler is put back after."""
    import dpcore.read.report.analyze as report

    def analyze(*args: object, **kwargs: object) -> str:
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the command")

    monkeypatch.setattr(report, "analyze", analyze)
    signal.signal(signal.SIGTERM, _mine)
    assert main(["analyze", "tests/data"]) == 130
    assert signal.getsignal(signal.SIGTERM) is _mine
