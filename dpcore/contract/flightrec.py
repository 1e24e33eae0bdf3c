"""PyTorch flight-recorder dumps: read them safely, summarise each rank, give the hang's verdict.

Why in the contract wing: the hang watchdog (write wing, while a job hangs) and the ``hang``
command and Hang page (read wing, afterwards) must reach the same verdict from the same dumps,
so the rule lives once, here, in plain Python.

What a dump is (torch 2.13, ``torch._C._distributed_c10d._dump_fr_trace[_json]``): a dict with
``entries`` (one per collective this process enqueued, oldest first, at most
``TORCH_FR_BUFFER_SIZE`` of them), ``pg_config`` and ``pg_status``. Gloo records entries without
durations: ``state`` stays ``scheduled``, and ``retired`` says the collective completed.

Why a restricted unpickler: PyTorch writes dumps as pickles by default, and a pickle can run any
code it names. A dump holds only dicts, lists, strings and numbers, so :func:`load_dump` refuses
every global (``find_class``) and every persistent id: a hostile dump fails in one line instead
of running. Why a bound on the loaded object too: a pickle's memo lets a few hundred bytes name
one list from many places (a list of two references to a list of two references ...), so a
530-byte file can stand for 2**60 elements; every later walk (``json.dumps``, the verdict) would
expand it. :func:`load_dump` counts the elements reachable as a tree and refuses more than the
file has bytes (an honest dump spends at least one byte per element) or deeper than
:data:`MAX_DEPTH`, which also refuses a list that contains itself. The same memo lets one
long string stand in many places (a 1 MiB name named 100 000 times is a 1.2 MB pickle and
100 GiB of text once printed or ``json.dumps``-ed), so the text reachable as a tree is bounded
too (:data:`MAX_DUMP_TEXT`; an honest pickle shares its short repeated strings, stack file
names and op names, and stays far below it). Only JSON's kinds of value are accepted (no
bytes, no sets): every reader after this one treats a dump as JSON.

Why the work is bounded by the bytes read, not by what they describe: a dump's elements are
capped (:data:`MAX_DUMP_NODES`, counted before a JSON file is parsed), a file by
:data:`MAX_DUMP_BYTES` (a pickle by :data:`MAX_PICKLE_BYTES`: one byte of pickle can make an
empty dict), and a tensor's byte count stops at :data:`MAX_TENSOR_BYTES` (a shape of a million
dimensions once cost a multiplication of million-digit numbers per entry: minutes). A dump
that cannot be read stands in the verdict as :func:`unreadable` (its rank "unknown"), never
as a rank without a dump (which would be evidence that the rank is behind).
"""
from __future__ import annotations

import functools
import io
import json
import pickle
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpcore.contract.files import open_inside
from dpcore.contract.tracefile import NotRegularFileError, open_regular
from dpcore.contract.units import exact_size

#: bytes per element of the dtype names the recorder writes
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
               "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8,
               "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
#: largest dump file read (a buffer of 20 000 entries with 20-frame stacks is 9 MB as a pickle,
#: about 30 MB as JSON)
MAX_DUMP_BYTES = 64 * 2**20
#: largest pickle dump read: a byte of pickle can build an empty dict (64 bytes of memory; a
#: 16 MiB pickle of them peaks at 1.5 GB before it is refused)
MAX_PICKLE_BYTES = 16 * 2**20
#: most elements (containers, strings, numbers) a dump may hold: a 20 000-entry buffer with
#: 20-frame stacks holds about 3.5 million
MAX_DUMP_NODES = 6_000_000
#: largest byte count of one tensor (a shape's product stops here: a claim, not a tensor)
MAX_TENSOR_BYTES = 2**63 - 1
#: most dimensions of one tensor's shape that are multiplied (torch allows 64)
MAX_DIMS = 64
#: the key that marks a rank's dump as unreadable (:func:`unreadable`); a dump file that holds
#: it has it removed
UNREADABLE = "_dpcore_unreadable"
#: most characters of text a dump may stand for when walked as a tree (shared strings counted
#: each time they are reached): the largest dump file read, as JSON, holds no more
MAX_DUMP_TEXT = MAX_DUMP_BYTES
#: deepest nesting accepted in a dump (a real one nests entries > frames > frame: about 5)
MAX_DEPTH = 64
#: elements a dump may hold beyond its byte count (the empty containers around it)
_SLACK_NODES = 1024
#: highest rank number read from a file name, verdict.json or run.json (2**20 ranks: above
#: any job run so far; a larger number is a stray file or a doctored field, not a rank)
MAX_RANKS = 1 << 20


class DumpError(ValueError):
    """A dump that cannot be read; the message is one line naming the file."""


class _NoGlobals(pickle.Unpickler):
    """An unpickler that builds only plain containers: any global or persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the pickle names a global ({module}.{name})")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the pickle holds a persistent id")


def _check_shape(data: Any, max_nodes: int, path: Path) -> None:
    """Refuse ``data`` when walking it as a tree visits more than ``max_nodes`` elements,
    more than :data:`MAX_DUMP_TEXT` characters of text, a value JSON cannot hold, or goes
    deeper than :data:`MAX_DEPTH` (shared and self-referring containers and strings counted
    each time they are reached, as ``json.dumps`` would). Iterative, with a stack of iterators
    (one per open container, so a flat list of millions costs one, not a pair per element),
    and it stops at the first bound passed. Exact types (``type(x) is``): neither JSON nor a
    pickle without globals makes a subclass."""
    seen, text = 1, 0
    stack: list[Any] = [iter((data,))]
    while stack:
        obj: Any = next(stack[-1], _END)
        if obj is _END:
            stack.pop()
            continue
        t = type(obj)
        if t is str:
            text += len(obj)
        elif t is dict or t is list or t is tuple:
            if not obj:
                continue
            if len(stack) > MAX_DEPTH:
                raise DumpError(f"{path}: refused: nested deeper than {MAX_DEPTH} levels (or "
                                "containing itself); not a flight-recorder dump")
            if t is dict:
                for k in obj:
                    if type(k) is str:
                        text += len(k)
                    elif not (k is None or type(k) in (int, float, bool)):
                        raise DumpError(f"{path}: refused: a dict key is not a string or number; "
                                        "not a flight-recorder dump")
                stack.append(iter(obj.values()))
            else:
                stack.append(iter(obj))
            seen += len(obj) * (2 if t is dict else 1)
        elif t in _NOT_JSON:
            raise DumpError(f"{path}: refused: holds a {t.__name__} value, which JSON "
                            "cannot; not a flight-recorder dump")
        if seen > max_nodes:
            raise DumpError(f"{path}: refused: the dump expands to more than {max_nodes} "
                            "elements (shared references, or simply too many); not a "
                            "flight-recorder dump")
        if text > MAX_DUMP_TEXT:
            raise DumpError(f"{path}: refused: the pickle expands to more than "
                            f"{MAX_DUMP_TEXT // 2**20} MiB of text (shared strings); not a "
                            "flight-recorder dump")


_END = object()
_NOT_JSON = (bytes, bytearray, set, frozenset)


def _elements_at_most(raw: bytes) -> int:
    """An upper bound of the elements a JSON text holds: one per comma and opening bracket,
    plus one (counted in C, before a parse that would build them)."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def load_dump(path: Path, within: Path | None = None) -> dict[str, Any]:
    """One dump file as a dict: JSON, or a pickle read without any global whose elements fit
    its size, :data:`MAX_DUMP_NODES`, :data:`MAX_DUMP_TEXT` and :data:`MAX_DEPTH` (DumpError
    else). ``within``: the folder (a run, a dump folder) the file must resolve inside."""
    try:
        opened = open_regular(path, MAX_DUMP_BYTES) if within is None \
            else open_inside(path, within, MAX_DUMP_BYTES)
        with opened as f:
            raw = f.read(MAX_DUMP_BYTES + 1)
    except NotRegularFileError as exc:
        raise DumpError(f"{exc}; not a flight-recorder dump") from None
    except OSError as exc:
        raise DumpError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_DUMP_BYTES:  # grew after the size check, or a /proc file of size 0
        raise DumpError(f"{path}: larger than {MAX_DUMP_BYTES // 2**20} MiB; not a "
                        "flight-recorder dump")
    is_json = raw[:1] in (b"{", b" ", b"\n")
    if not is_json and len(raw) > MAX_PICKLE_BYTES:
        raise DumpError(f"{path}: a pickle larger than {MAX_PICKLE_BYTES // 2**20} MiB; not read "
                        "(write the dump as JSON)")
    if is_json and _elements_at_most(raw) > MAX_DUMP_NODES:
        raise DumpError(f"{path}: refused: holds more than {MAX_DUMP_NODES} elements; not a "
                        "flight-recorder dump")
    if is_json:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise DumpError(f"{path}: not valid JSON ({exc})") from None
        except RecursionError:
            raise DumpError(f"{path}: refused: JSON nested too deeply; not a flight-recorder "
                            "dump") from None
    else:
        try:
            data = _NoGlobals(io.BytesIO(raw)).load()
        except pickle.UnpicklingError as exc:
            raise DumpError(f"{path}: refused: {exc}; dpcore never runs code from a dump "
                            "(write it as JSON or as a plain pickle)") from None
        except Exception as exc:  # noqa: BLE001 - truncated or not a pickle at all
            raise DumpError(f"{path}: not a flight-recorder dump ({type(exc).__name__})") from None
    _check_shape(data, min(len(raw) + _SLACK_NODES, MAX_DUMP_NODES), path)
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        raise DumpError(f"{path}: not a flight-recorder dump (no 'entries' list)")
    data.pop(UNREADABLE, None)  # only a reader marks a dump unreadable, never the file itself
    return data


def unreadable(reason: str) -> dict[str, Any]:
    """What stands for a rank whose dump exists but could not be read (refused, unreadable,
    set aside): the verdict counts that rank as unknown, neither behind nor in step."""
    return {"entries": [], UNREADABLE: reason}


def is_unreadable(dump: dict[str, Any]) -> bool:
    return UNREADABLE in dump


#: the entry fields the verdict and the rank table read (:func:`slim`)
ENTRY_FIELDS = ("collective_seq_id", "profiling_name", "input_sizes", "input_dtypes", "is_p2p",
                "process_group", "retired", "state")


def slim(dump: dict[str, Any]) -> dict[str, Any]:
    """The dump with only what the verdict and the rank table read (each entry's
    :data:`ENTRY_FIELDS`): a reader holding a thousand ranks' dumps keeps their collectives,
    not their stacks and configuration."""
    if is_unreadable(dump):
        return dump
    entries = [{k: e[k] for k in ENTRY_FIELDS if k in e} if isinstance(e, dict) else e
               for e in dump.get("entries") or []]
    return {"entries": entries}


def rank_of(path: Path) -> int | None:
    """The rank a dump file is for: ``rank<r>.fr.json`` (dpcore) or the trailing digits that
    PyTorch appends to ``TORCH_FR_DUMP_TEMP_FILE`` (``nccl_trace_rank_3``)."""
    m = re.search(r"rank(\d+)\.fr\.json$", path.name) or re.search(r"(\d+)(\.json|\.pkl)?$",
                                                                     path.name)
    return plausible_rank(m.group(1)) if m else None


def plausible_rank(value: Any) -> int | None:
    """``value`` as a rank number when it is a whole number in ``0 .. MAX_RANKS - 1``, else
    None: a rank taken from a file name or a JSON field is a claim, and a list is built over
    it (``range(world_size)``), so an absurd one is dropped, not believed."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() \
            and len(value.strip()) <= 7:
        r = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        r = value
    elif isinstance(value, float) and value.is_integer() and abs(value) < MAX_RANKS:
        r = int(value)
    else:
        return None
    return r if 0 <= r < MAX_RANKS else None


def plausible_world(value: Any) -> int | None:
    """``value`` as a world size (``1 .. MAX_RANKS``), else None (see :func:`plausible_rank`)."""
    last = plausible_rank(value - 1) if isinstance(value, (int, float)) \
        and not isinstance(value, bool) else None
    return None if last is None else last + 1


@dataclass(frozen=True)
class Collective:
    """One flight-recorder entry, as the verdict needs it."""

    seq: int
    op: str
    bytes: int
    sizes: str
    completed: bool
    pg: str

    @property
    def signature(self) -> tuple[str, str]:
        return (self.op, self.sizes)


def _op(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "?")
    return name.split(":", 1)[1] if ":" in name else name


def _bytes(entry: dict[str, Any]) -> int:
    """The entry's input bytes: each shape's product times its dtype's size, at most
    :data:`MAX_TENSOR_BYTES` (the product stops there, and at :data:`MAX_DIMS` dimensions:
    a longer shape or a larger count is a claim no tensor makes)."""
    total = 0
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return 0
    for shape, dtype in zip(sizes, dtypes):
        n = DTYPE_BYTES.get(str(dtype), 4) if isinstance(dtype, str) else 4
        for d in (shape[:MAX_DIMS] if isinstance(shape, list) else []):
            n *= _dim(d)
            if n > MAX_TENSOR_BYTES or n == 0:
                break
        total = min(total + n, MAX_TENSOR_BYTES)
    return total


def _dim(d: Any) -> int:
    """One dimension of a shape: a whole number 0 .. MAX_TENSOR_BYTES (0 for anything else)."""
    if isinstance(d, bool):
        return 0
    if isinstance(d, int):
        return d if 0 <= d <= MAX_TENSOR_BYTES else MAX_TENSOR_BYTES + 1 if d > 0 else 0
    try:
        v = int(d) if isinstance(d, str) and len(d) <= 20 else int(float(d)) if isinstance(d, float) else 0
    except (ValueError, OverflowError):
        return 0
    return v if 0 <= v <= MAX_TENSOR_BYTES else 0


def _seq(v: Any) -> int:
    """A sequence number: a whole number, -1 for anything else (a list, text, 10**400)."""
    if isinstance(v, bool):
        return -1
    if isinstance(v, int):
        return v if -1 <= v < 2**63 else -1
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 19:
        return int(v)
    return -1


def collectives(dump: dict[str, Any]) -> list[Collective]:
    """The dump's collectives (p2p entries left out), oldest first."""
    out = []
    for e in dump.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group") or ["0"]
        out.append(Collective(
            seq=_seq(e.get("collective_seq_id", -1)), op=_op(e), bytes=_bytes(e),
            sizes=json.dumps(e.get("input_sizes") or []),
            completed=bool(e.get("retired")) or e.get("state") == "completed",
            pg=str(pg[0] if isinstance(pg, (list, tuple)) else pg)))
    return out


def stack_top(stack: str) -> str:
    """The innermost telling frame of the main thread in a ``faulthandler`` dump: the block
    that is not a started thread (no ``_bootstrap`` frame), its first frame outside the
    standard library's ``threading.py`` ('' when there is none)."""
    blocks = re.split(r"\n\s*\n|\n(?=(?:Current thread|Thread) 0x)", stack.strip())
    for part in blocks:
        frames = [ln.strip() for ln in part.splitlines() if ln.strip().startswith("File")]
        if frames and not any(re.search(r"threading\.py\", line \d+ in _bootstrap$", f)
                              for f in frames):
            telling = [f for f in frames if not re.search(r"[/\\]threading\.py\"", f)]
            m = re.match(r'File "(?:.*[/\\])?([^/\\"]+)", line (\d+) in (.*)', (telling or frames)[0])
            return f"{m.group(1)}:{m.group(2)} in {m.group(3)}" if m else (telling or frames)[0]
    return ""


@dataclass(frozen=True)
class RankState:
    """Per rank: the last enqueued and last completed collective (``hang`` prints these)."""

    rank: int
    last_enqueued_seq: int
    last_completed_seq: int
    op: str
    bytes: int
    state: str
    stack_top: str


@dataclass(frozen=True)
class Verdict:
    """Which rank is behind and where (``missing``), or which collective the ranks disagree on
    (``desync``); ``unknown`` when the dumps show neither. verdict.json holds these fields."""

    kind: str
    lagging_ranks: list[int]
    seq: int
    op: str
    bytes: int
    pg: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _main_pg(per_rank: dict[int, list[Collective]]) -> str:
    """The process group the hang is in: the one with a collective not completed somewhere
    (most entries wins), else the one with most entries."""
    pending = Counter(c.pg for cs in per_rank.values() for c in cs if not c.completed)
    counts = pending or Counter(c.pg for cs in per_rank.values() for c in cs)
    return counts.most_common(1)[0][0] if counts else "0"


def rank_states(dumps: dict[int, dict[str, Any]], stacks: dict[int, str] | None = None) -> list[RankState]:
    """One row per rank: its last enqueued collective (seq, op, bytes, state) and last
    completed seq in the hang's process group, and the top of its stack."""
    per = {r: collectives(d) for r, d in dumps.items()}
    pg = _main_pg(per)
    rows = []
    for r in sorted(per):
        if is_unreadable(dumps[r]):
            rows.append(RankState(r, -1, -1, "", 0, "unreadable", stack_top((stacks or {}).get(r, ""))))
            continue
        cs = [c for c in per[r] if c.pg == pg]
        last = cs[-1] if cs else None
        done = [c.seq for c in cs if c.completed]
        rows.append(RankState(r, last.seq if last else -1, max(done) if done else -1,
                              last.op if last else "", last.bytes if last else 0,
                              ("completed" if last.completed else "waiting") if last else "idle",
                              stack_top((stacks or {}).get(r, ""))))
    return rows


def _names(ranks: list[int]) -> str:
    """``rank 3`` / ``ranks 0, 2`` / ``ranks 0, 4-1023``: runs of three or more consecutive
    ranks as a range, so the message stays one short line for a large world."""
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def _rarity(sig: tuple[str, str], s: int, groups: dict[tuple[str, str], list[int]],
            by_seq: dict[int, dict[int, Collective]], history: Counter[tuple[Any, ...]]) -> tuple[int, int]:
    """How usual the ranks with signature ``sig`` at seq ``s`` look: how often their (previous,
    this) pair occurred in the agreed history, then how many ranks share it."""
    prev = by_seq[groups[sig][0]].get(s - 1)
    return history[(prev.signature if prev else None, sig)], len(groups[sig])


def verdict(dumps: dict[int, dict[str, Any]], world_size: int | None = None) -> Verdict:
    """The hang's verdict from every rank's dump (ranks without a dump count as missing when
    ``world_size`` says they exist).

    Desync first: at the first sequence number every rank recorded, do the ranks agree on the
    op and the sizes? Where they differ, the deviant is the rank whose (previous, this)
    collective pair is rarest in the history all ranks agree on (a skipped all-reduce turns
    "barrier, all_reduce" into the never-seen "barrier, barrier"), ties going to the minority.
    Else missing: the ranks whose last enqueued seq is below the others' never entered the
    collective the others wait in.

    A rank whose dump is :func:`unreadable` is unknown: left out of both rules, never counted
    as absent, and named in the message (it may be the rank behind)."""
    lost = sorted(r for r, d in dumps.items() if is_unreadable(d))
    dumps = {r: d for r, d in dumps.items() if not is_unreadable(d)}
    v = _verdict(dumps, world_size, lost)
    if not lost:
        return v
    note = (f"; {_names(lost)}: dump unreadable, unknown" if v.kind != "unknown" else
            f"; {_names(lost)}: dump unreadable, unknown (it may be the rank behind)")
    return Verdict(v.kind, v.lagging_ranks, v.seq, v.op, v.bytes, v.pg, v.message + note)


def _verdict(dumps: dict[int, dict[str, Any]], world_size: int | None, lost: list[int]) -> Verdict:
    """:func:`verdict` of the readable dumps (``lost``: the unreadable ranks, not absent)."""
    per = {r: collectives(d) for r, d in dumps.items()}
    pg = _main_pg(per)
    by_seq = {r: {c.seq: c for c in cs if c.pg == pg} for r, cs in per.items()}
    common = sorted(set.intersection(*(set(s) for s in by_seq.values()))) if by_seq else []
    history: Counter[tuple[Any, ...]] = Counter()
    for s in common:
        sigs = {by_seq[r][s].signature for r in by_seq}
        if len(sigs) == 1:
            prev = by_seq[next(iter(by_seq))].get(s - 1)
            history[(prev.signature if prev else None, sigs.pop())] += 1
            continue
        groups: dict[tuple[str, str], list[int]] = {}
        for r in sorted(by_seq):
            groups.setdefault(by_seq[r][s].signature, []).append(r)

        odd = min(groups, key=functools.partial(_rarity, s=s, groups=groups, by_seq=by_seq, history=history))
        lag = groups[odd]
        others = [r for r in sorted(by_seq) if r not in lag]
        ref = by_seq[others[0]][s]
        mine = by_seq[lag[0]][s]
        msg = (f"desync at collective seq {s}: {_names(others)} entered {ref.op} "
               f"({exact_size(ref.bytes)}) but {_names(lag)} entered {mine.op} ({exact_size(mine.bytes)})")
        return Verdict("desync", lag, s, ref.op, ref.bytes, pg, msg)
    last = {r: max(m) if m else -1 for r, m in by_seq.items()}
    # a world size beyond MAX_RANKS is a doctored claim, not a job: it adds no absent ranks
    absent = [r for r in range(plausible_world(world_size) or 0) if r not in dumps and r not in lost]
    top = max(last.values(), default=-1)
    behind = sorted([r for r, v in last.items() if v < top] + absent)
    if behind and top >= 0:
        ahead = [r for r in sorted(last) if last[r] == top]
        want = min((last[r] for r in behind if r in last), default=top - 1) + 1
        ref = by_seq[ahead[0]].get(want) or by_seq[ahead[0]][top]
        msg = (f"{_names(behind)} never entered collective seq {ref.seq} ({ref.op}, "
               f"{exact_size(ref.bytes)}) that {_names(ahead)} "
               f"{'wait' if len(ahead) > 1 else 'waits'} in")
        return Verdict("missing", behind, ref.seq, ref.op, ref.bytes, pg, msg)
    waiting = sorted(r for r, m in by_seq.items() if any(not c.completed for c in m.values()))
    who = "every readable rank" if lost else "every rank"
    msg = (f"{who} entered collective seq {top} and it has not completed on "
           f"{_names(waiting)}; the dumps name no lagging rank" if waiting else
           f"{who} completed every recorded collective: no hang in these dumps")
    return Verdict("unknown", [], top, "", 0, pg, msg)
