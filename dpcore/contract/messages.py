"""Which receive belongs to which send: one pairing rule for every reader of messages.csv.

Why one rule: the merged Perfetto trace (write wing), the ring wait/transfer analysis and the
message picture (read wing) all join a point-to-point send with its receive. Both sides log a
row with the same key (``runformat.MESSAGE_KEY``: job, algorithm, step, call, phase, ring step,
src, dst, chunk). The pipelined ring sends one chunk as several sub-messages that share that
key, and point-to-point messages between two ranks arrive in the order they were posted, so
the n-th send of a key is received by the n-th receive of that key. Joining on the key alone
would pair every send with every receive.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from dpcore.contract.runformat import MESSAGE_KEY


def message_key(row: Mapping[str, object]) -> tuple[str, ...]:
    """The key of one messages.csv row, as strings (so ``1`` and ``"1"`` from a CSV agree);
    a column the row lacks is ignored, as in a foreign file without ``job_id``."""
    return tuple(str(row[k]) for k in MESSAGE_KEY if k in row)


def piece_numbers(keys: Sequence[Hashable], sides: Sequence[str], posts: Sequence[float]) -> list[int]:
    """For each message row, its ``piece``: how many rows of the same key and side were posted
    before it (0 for the first). (key, piece) names one message on both of its sides."""
    order = sorted(range(len(keys)), key=lambda i: posts[i])  # stable: ties keep file order
    seen: dict[tuple[Hashable, str], int] = {}
    out = [0] * len(keys)
    for i in order:
        k = (keys[i], sides[i])
        out[i] = seen.get(k, 0)
        seen[k] = out[i] + 1
    return out


def pair_messages(keys: Sequence[Hashable], sides: Sequence[str], posts: Sequence[float],
                  pieces: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """(send index, receive index) of every message seen on both sides, in send-posting order.
    ``pieces``: :func:`piece_numbers` of the same rows, when the caller has them already."""
    pieces = piece_numbers(keys, sides, posts) if pieces is None else pieces
    recv = {(keys[i], pieces[i]): i for i in range(len(keys)) if sides[i] == "recv"}
    sends = sorted((i for i in range(len(keys)) if sides[i] == "send"), key=lambda i: posts[i])
    return [(i, recv[(keys[i], pieces[i])]) for i in sends if (keys[i], pieces[i]) in recv]
