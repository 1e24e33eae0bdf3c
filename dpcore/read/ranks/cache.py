"""A rank's reduced tables on disk: a dpcore run's own ``cache/``, else the user's cache, Parquet.

Why: every ``summarize``, ``analyze``, ``stragglers``, ``whatif`` and the dashboard's first open
otherwise re-read every rank's trace (the parse is 95 % of their time). The first read of a rank
stores its :class:`~dpcore.read.ranks.reduce.RankTables` here; a later read whose trace has the
same size, mtime, ctime and inode, read by the same reader (:data:`CACHE_VERSION`) and each table
by the same reduction (its :attr:`~dpcore.read.traces.rank_table.RankTable.version`), loads them
instead (ctime: a trace rewritten and given its old mtime back still misses).

Never authoritative: deleting ``cache/`` changes no number (tests compare the two paths), a
cache file that cannot be read is a miss, and one that cannot be written is skipped (the read
goes on). Where it lives (:func:`cache_dir`): a dpcore run's ``cache/`` (a folder with run.json,
when writable); a folder of someone's traces gets no files: reading must not write into a user's
trace folder, so its cache lives in the user's cache directory (``$XDG_CACHE_HOME/dpcore``, else
``~/.cache/dpcore``), one folder per traces folder. A ``cache`` that is a symlink is never
written through (reading a run must not write outside it): the user's cache is used instead.

Why it trusts only what the reader owns: a shared ``$DPCORE_CACHE_DIR``, a run folder others
may write, or a planted file must neither doctor a number nor make the reader write through a
link or hang. So (:func:`_own_folder`, :func:`_read_owned`, :func:`_write_new`) the base folder
and each cache folder must be a real folder (not a link) owned by the reader, mode 0700 (a
looser one of the reader's own is tightened; someone else's is not used: no cache); the key
must be a regular file of the reader's, mode 0600 (else it is replaced, or, outside the
reader's own folder, the cache is off); every cache file is opened with O_NOFOLLOW and
O_NONBLOCK and read only when it is a regular file of the reader's of at most
:data:`MAX_CACHE_FILE_BYTES` (a link, a FIFO, a device, a sparse giant: a miss, never a hang or
a MemoryError); and every file written is created new (O_CREAT | O_EXCL | O_NOFOLLOW, a random
name, mode 0600) and renamed into place, so a planted temporary name is never written through.
Nothing is pickled: one Parquet file per table per folder (``ranks``: rank, world size,
events and notes of each trace; one per table a reader declared, named by the table
(``overlap``, ``comm``, ``lanes``, the ``import_*`` and ``gpu*`` tables): every trace's rows, a
``_trace`` column naming it), each listing the traces it holds and their keys in its schema
metadata (JSON). The cache knows no table by name: it stores and loads the declarations it is
given. One file per table, not per rank: reading 1,024 small files costs more than the rows in
them. Without pyarrow there is no cache (the same numbers, read every time).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpcore.contract.runformat import RUN_JSON
from dpcore.read.ranks.reduce import RankTables
from dpcore.read.traces.rank_table import RankTable

#: Bump when the reader or the reduction changes what a rank's tables hold: every cache entry
#: written by an older version is then a miss. 2: the ``lanes`` and ``import_*`` tables. 3: gloo's spans
#: are comm in a GPU trace without NCCL kernels (gloo over CUDA tensors). 4: the lanes' ``kind``
#: column and GPU ranks' launch-thread and stream lanes. 5: the lanes' comm spans cut as the overlap
#: numbers cut them (a DDP all-reduce at backward's end).
#: 6: the GEMMs' FLOPs, TFLOP/s and MFU in ``gpu_kernels`` (the reader keeps matrix products' shapes).
#: 7: each table's entries keyed by its declaration's version too (a reduction's change misses only
#: its table).
CACHE_VERSION = 7
CACHE_DIR = "cache"
#: the user's signing key for cache files (:func:`_key`), beside the user's caches
_KEY_FILE = "key"
_META = b"dpcore"
#: Largest cache file read or written (a table of every rank of a 1,024-rank job is far below
#: it): a larger one (a sparse file, a planted giant) is a miss, not a MemoryError.
MAX_CACHE_FILE_BYTES = 2 << 30
_KEY_BYTES = 32
_MAC_BYTES = 64  # a hex SHA-256
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _pa():
    """pyarrow and its Parquet module, or None where pyarrow is not installed (no cache)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    return pa, pq


def table_key(key: list, table: RankTable) -> list:
    """A trace's key (:func:`stat_key`) for one table's entry: with the table's version."""
    return [*key, int(table.version)]


def stat_key(path: Path, only: bool) -> list:
    """What must match for a cache entry to stand for ``path``: size, mtime, ctime (ns), inode,
    the version, and ``only`` (a lone trace without a rank reads as rank 0; one of several is
    an error). ctime cannot be set back by a program (``os.utime`` sets mtime and moves ctime),
    so a trace rewritten with its size and mtime kept is a miss; a copied run is one too."""
    st = path.stat()
    return [int(st.st_size), int(st.st_mtime_ns), int(st.st_ctime_ns), int(st.st_ino),
            CACHE_VERSION, bool(only)]


class CacheDirError(ValueError):
    """``$DPCORE_CACHE_DIR`` is not an absolute path (one line naming it)."""


def _folder_id(root: Path) -> str:
    return hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]


def user_cache_dir(root: Path) -> Path:
    """The user's cache folder for the traces under ``root`` (a folder that is not a dpcore
    run, or one whose ``cache/`` is not writable or not a real folder)."""
    return _user_base() / _folder_id(root)


def _user_base() -> Path:
    """``$XDG_CACHE_HOME/dpcore``, else ``~/.cache/dpcore`` (a relative XDG_CACHE_HOME is
    invalid by the XDG spec and ignored)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpcore"
    return base if base.is_absolute() else Path.home() / ".cache" / "dpcore"


def env_cache_dir() -> Path | None:
    """``$DPCORE_CACHE_DIR`` when set, which must be absolute (CacheDirError else): a relative
    one would land wherever the command happens to run, a different folder per working
    directory."""
    value = os.environ.get("DPCORE_CACHE_DIR")
    if not value:
        return None
    if not os.path.isabs(value):
        raise CacheDirError(f"DPCORE_CACHE_DIR must be an absolute path, got {value!r}; give "
                            "one such as $HOME/.cache/dpcore, or unset it")
    return Path(value)


def cache_dir(root: Path) -> Path:
    """Where ``root``'s cache lives: under ``$DPCORE_CACHE_DIR`` (one folder per ``root``) when
    that is set (a test suite or a read-only deployment keeps every cache out of the folders it
    reads); ``root/cache`` when ``root`` is a dpcore run (it has run.json), is writable and its
    ``cache`` is a real folder or absent (not a symlink: nothing is written outside the run);
    else :func:`user_cache_dir`."""
    env = env_cache_dir()
    if env is not None:
        return env / _folder_id(root)
    here = root / CACHE_DIR
    is_run = (root / RUN_JSON).is_file()
    if is_run and not here.is_symlink() and (_owned_dir(here) or not os.path.lexists(here)) \
            and os.access(here if here.is_dir() else root, os.W_OK):
        return here
    return user_cache_dir(root)


def _owned_dir(d: Path) -> bool:
    """Whether ``d`` is a real folder (not a link) owned by this user."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def _own_folder(d: Path, create: bool, follow: bool = False) -> bool:
    """Whether ``d`` may hold this user's cache: a folder owned by this user, mode 0700
    (a looser one of the user's own is tightened: an older dpcore made it 0755); a link
    (unless ``follow``: the base folder the user named may be one) or someone else's folder
    is refused, so nothing is read from or written through what another user controls.
    ``create``: made (mode 0700) when absent."""
    try:
        if create and not os.path.lexists(d):
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
        st = os.stat(d) if follow else os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(d, 0o700)
    except OSError:
        return False
    return True


def _read_owned(f: Path, max_bytes: int, private: bool = False) -> bytes | None:
    """The bytes of a cache file, or None (a miss) unless it is a regular file owned by this
    user, of at most ``max_bytes``, opened without following a link (O_NOFOLLOW) or waiting on
    a FIFO (O_NONBLOCK); ``private``: also mode 0600 or stricter (the key)."""
    try:
        fd = os.open(f, _READ_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > max_bytes \
                or (private and stat.S_IMODE(st.st_mode) & 0o077):
            return None
        chunks, left = [], max_bytes + 1  # the file may grow after the check
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data if len(data) <= max_bytes else None


def _write_new(d: Path, name: str, data: bytes) -> Path:
    """``data`` in a new file of a random name in ``d`` (O_CREAT | O_EXCL | O_NOFOLLOW, mode
    0600: a name planted beforehand, a link included, makes it fail, never written through);
    its path, for the caller to rename into place."""
    tmp = d / f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _name(root: Path, trace: Path) -> str:
    """How the cache names a trace: its path under ``root`` (its absolute path when outside)."""
    try:
        return trace.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:  # a trace outside root (a symlink)
        return str(trace.resolve())


def _path(root: Path, table: str) -> Path:
    return cache_dir(root) / f"{table}.parquet"


def _key() -> bytes | None:
    """This user's secret for signing cache files (32 random bytes, mode 0600, made on first
    use beside the user's caches, or in ``$DPCORE_CACHE_DIR``); None where it cannot be had
    (then nothing is read from or written to the cache): the folder is someone else's (a shared
    ``$DPCORE_CACHE_DIR``: a key planted there would let its owner sign doctored numbers). A key
    file that is not this user's 32-byte regular file of mode 0600 (a link, a FIFO, a looser
    mode) is replaced by a new key: every file signed with the old one is then a miss."""
    env = env_cache_dir()
    base = env if env is not None else _user_base()
    if not _own_folder(base, create=True, follow=True):
        return None
    f = base / _KEY_FILE
    for _ in range(2):
        key = _read_owned(f, _KEY_BYTES, private=True)
        if key is not None and len(key) == _KEY_BYTES:
            return key
        try:
            tmp = _write_new(base, _KEY_FILE, secrets.token_bytes(_KEY_BYTES))
            if os.path.lexists(f):  # not ours, not regular, not private, not 32 bytes
                os.replace(tmp, f)
            else:
                try:
                    os.link(tmp, f)  # first use: a key another process made meanwhile wins
                except FileExistsError:
                    pass
                os.unlink(tmp)
        except OSError:
            return None
    return None


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).hexdigest().encode()


def _read(pq: Any, root: Path, table: str) -> tuple[dict[str, list], Any]:
    """({trace name: key} of the entries a table file holds, the pyarrow table), or ({}, None).

    A file is read only when its ``.mac`` (an HMAC of its bytes with this user's key,
    :func:`_key`) matches: the cache lives in folders others may write (a shared run), and a
    doctored Parquet file would otherwise change numbers silently; unsigned or altered, it is a
    miss, and the traces are read again."""
    try:
        key = _key()
        d = cache_dir(root)
        if key is None or not _own_folder(d, create=False):
            return {}, None
        f = _path(root, table)
        raw = _read_owned(f, MAX_CACHE_FILE_BYTES)
        mac = _read_owned(f.with_name(f.name + ".mac"), _MAC_BYTES)
        if raw is None or mac is None or not hmac.compare_digest(mac, _mac(key, raw)):
            return {}, None
        t = pq.read_table(_pa()[0].BufferReader(raw))
        entries = json.loads((t.schema.metadata or {}).get(_META, b"{}"))
    except CacheDirError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # missing, truncated or foreign: all misses
        return {}, None
    return (entries, t) if isinstance(entries, dict) else ({}, None)


def _split(df: pd.DataFrame, names: pd.Series) -> dict[str, pd.DataFrame]:
    """{trace name: its rows} of a table whose rows are stored trace by trace (contiguous), by
    slicing: a groupby of 1,024 traces costs more than reading them."""
    names = names.to_numpy()
    if not len(names):
        return {}
    cut = np.flatnonzero(names[1:] != names[:-1]) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(names)]
    return {names[a]: df.iloc[a:b].reset_index(drop=True) for a, b in zip(starts, ends)}


def load(root: Path, traces: list[Path], only: bool, need: tuple[RankTable, ...]) -> dict[int, RankTables]:
    """{position in ``traces``: cached tables} of the traces whose entry matches :func:`stat_key`
    in every table of ``need`` (:func:`table_key`; the RankTables hold those tables only)."""
    mods = _pa()
    if mods is None or not traces:
        return {}
    _, pq = mods
    want: dict[str, tuple[int, list]] = {}
    for i, f in enumerate(traces):
        try:
            want[_name(root, f)] = (i, stat_key(f, only))
        except OSError:
            continue
    entries, info = _read(pq, root, "ranks")
    hits = {n for n, (_, k) in want.items() if entries.get(n) == k}
    frames: dict[str, pd.DataFrame] = {}
    for table in need:
        got, t = _read(pq, root, table.name)
        hits = {n for n in hits if got.get(n) == table_key(entries[n], table)}
        if hits and t is not None:
            frames[table.name] = t.to_pandas()
    if not hits or info is None:
        return {}
    ranks = info.to_pandas()
    ranks = ranks[ranks["_trace"].isin(hits)]
    parts = {t.name: _split(t.typed(df[df["_trace"].isin(hits)]), df.loc[df["_trace"].isin(hits), "_trace"])
             for t in need if (df := frames.get(t.name)) is not None}
    out = {}
    empty = {t.name: t.empty() for t in need}  # one shared empty frame per table: a trace without rows
    for name, rank, ws, events, notes in zip(ranks["_trace"], ranks["rank"], ranks["world_size"],
                                             ranks["events"], ranks["notes"]):
        notes = _notes(notes)
        if notes is None:
            continue  # a doctored entry: a miss, read again
        tables = {t.name: parts[t.name].get(name, empty[t.name]) for t in need}
        out[want[name][0]] = RankTables(rank=int(rank), world_size=None if ws < 0 else int(ws), events=int(events),
                                        notes=notes, frames=tables)
    return out


def held(root: Path, traces: list[Path], only: bool, table: RankTable) -> set[int]:
    """Positions in ``traces`` whose entry of ``table`` in ``root``'s cache matches the trace as it
    is now (:func:`stat_key`, :func:`table_key`): a read that misses another table need not build
    this one again (the overlap of a 30,000-step trace costs a first read more than its parse)."""
    mods = _pa()
    if mods is None or not traces:
        return set()
    _, pq = mods
    entries, _ = _read(pq, root, "ranks")
    got, _ = _read(pq, root, table.name)
    out = set()
    for i, f in enumerate(traces):
        try:
            k = stat_key(f, only)
        except OSError:
            continue
        n = _name(root, f)
        if entries.get(n) == k and got.get(n) == table_key(k, table):
            out.add(i)
    return out


def _notes(raw: object) -> list[str] | None:
    """A cache entry's notes (a JSON list of strings), None when they are anything else
    (nested lists deep enough to exhaust the parser's recursion included)."""
    try:
        notes = json.loads(raw) if isinstance(raw, (str, bytes)) else None
    except (ValueError, RecursionError):
        return None
    return notes if isinstance(notes, list) and all(isinstance(n, str) for n in notes) else None


def store(root: Path, entries: list[tuple[Path, bool, list, RankTables]],
          tables: tuple[RankTable, ...]) -> bool:
    """Add (trace, only, key, tables) entries to ``root``'s cache (``key``: :func:`stat_key` taken
    *before* the trace was read, so a trace rewritten meanwhile misses next time), keeping the
    other traces' entries; ``tables``: the declarations of the tables the entries hold. Each
    table file is rewritten to a temporary name and renamed; a table file lists the entries it
    holds, so a reader never pairs tables of different writers. False where it could not be
    written (the read goes on)."""
    mods = _pa()
    if mods is None or not entries:
        return False
    pa, pq = mods
    new = {_name(root, f): (key, t) for f, _, key, t in entries}
    rows = pd.DataFrame({"_trace": list(new), "rank": [t.rank for _, t in new.values()],
                         "world_size": [-1 if t.world_size is None else t.world_size for _, t in new.values()],
                         "events": [t.events for _, t in new.values()],
                         "notes": [json.dumps(t.notes) for _, t in new.values()]})
    try:
        d = cache_dir(root)
        key = _key()  # first: it checks the base folder the cache folder is made in
        if key is None or not _own_folder(d, create=True):
            return False
        for table in (None, *tables):  # None: the ranks file
            name = "ranks" if table is None else table.name

            def keyed(k: list, table: RankTable | None = table) -> list:
                return k if table is None else table_key(k, table)
            # a table this read did not build keeps its entries of the same key
            mine = new if table is None else {n: v for n, v in new.items() if name in v[1].frames}
            old, t = _read(pq, root, name)
            keep = {n: k for n, k in old.items() if n not in mine and (n not in new or keyed(new[n][0]) == k)}
            if not mine and (len(keep) == len(old)):
                continue  # nothing to add, nothing stale to drop
            df = rows if table is None else pd.concat(
                [tb.frames[name].assign(_trace=n) for n, (_, tb) in mine.items()]
                or [table.empty().assign(_trace=pd.Series(dtype=object))], ignore_index=True)
            if t is not None and keep:
                prev = t.to_pandas()
                df = pd.concat([prev[prev["_trace"].isin(keep)], df], ignore_index=True)
            meta = json.dumps({**keep, **{n: keyed(k) for n, (k, _) in mine.items()}}).encode()
            at = pa.Table.from_pandas(df, preserve_index=False)
            at = at.replace_schema_metadata({**(at.schema.metadata or {}), _META: meta})
            f = _path(root, name)
            out = pa.BufferOutputStream()
            pq.write_table(at, out)
            data = out.getvalue().to_pybytes()
            if len(data) > MAX_CACHE_FILE_BYTES:  # it would never be read back
                return False
            tmp = _write_new(d, f.name, data)
            try:
                sig = _write_new(d, f.name + ".mac", _mac(key, data))
            except OSError:
                os.unlink(tmp)
                raise
            os.replace(tmp, f)
            os.replace(sig, f.with_name(f.name + ".mac"))
    except (OSError, ValueError, TypeError):
        return False
    return True
