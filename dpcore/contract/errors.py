"""Errors that the CLI turns into one clear line instead of a traceback."""
from __future__ import annotations


class UsageError(ValueError):
    """Bad user input. The CLI prints ``error: <message>`` and exits with status 2.

    The message must name the problem and the valid choices, so a user can fix the
    command without reading code.
    """


class JobFailed(RuntimeError):
    """A distributed job failed: a rank raised, died, or the job timed out.

    ``rank`` is the first rank that failed (-1 when no single rank is to blame, e.g. a
    timeout), ``message`` the rank's exception text.
    """

    def __init__(self, rank: int, message: str) -> None:
        self.rank = rank
        self.message = message
        where = f"rank {rank}" if rank >= 0 else "job"
        super().__init__(f"{where} failed: {message}")


def choices_error(what: str, value: object, valid: list[str] | tuple[str, ...]) -> UsageError:
    """Build the standard 'unknown X' error listing the valid choices."""
    return UsageError(f"unknown {what} {value!r}; valid choices: {', '.join(valid)}")
