"""Every public function and class of the read wing has a user outside tests/, and the
all-ranks events reader stays out of the package.

Why: a public name that only tests call is a second path the commands never take: it looks
like part of the product, is documented and maintained as such, and its numbers can drift from
the ones users see. The reference paths the tests check the product against (every rank's events
read into one frame, the analyses of such a frame) live in tests/trace_helpers.py instead.
A user is a reference from dpcore/, app.py, scripts/, benchmarks/ or examples/ other than the
name's own definition and a package's re-export: a name, an attribute, an import, or a string
naming it (the command table's ``"module:function"``).
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import dpcore.read.traces

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dpcore"
PRODUCTION = [PKG, ROOT / "app.py", ROOT / "scripts", ROOT / "benchmarks", ROOT / "examples"]
#: The read wing's packages whose public names this test holds to the rule.
CHECKED = ("traces", "rundir", "plots", "analysis", "ranks", "importer", "report", "whatif", "dashboard")
#: Public names that only tests use today, in modules other sessions own: each one should move
#: to tests/ (or find its user) and leave this list; none may join it.
KNOWN: frozenset[str] = frozenset({
    "dpcore.read.analysis.gpu_flops.peak_device",
    "dpcore.read.analysis.gpu_kernels.kernel_classes",
    "dpcore.read.whatif.model.allreduce_ms",
    "dpcore.read.whatif.predict.whatif_table",
})
#: The all-ranks events reader's names: tests/trace_helpers.py, never dpcore/.
ALL_RANKS_READER = ("read_trace_dir", "read_trace_files", "concat_events")


def _files(paths: list[Path]) -> list[Path]:
    return sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")) if f.suffix == ".py")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_defs(path: Path, source: str | None = None) -> list[str]:
    """The public top-level functions and classes a module defines."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not n.name.startswith("_")]


def used_names(path: Path, source: str | None = None) -> set[str]:
    """Names a file uses, each definition's own body left out (a function that only calls itself
    has no user), and so are docstrings (naming is not using), ``__all__`` and a package
    ``__init__``'s re-exports (an export is not a use)."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    out: set[str] = set()
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for top in tree.body:
        if path.name == "__init__.py" and isinstance(top, ast.ImportFrom) or _is_all(top):
            continue
        here: set[str] = set()
        for n in ast.walk(top):
            if id(n) in prose:  # a docstring names, it does not use
                continue
            if isinstance(n, ast.Name):
                here.add(n.id)
            elif isinstance(n, ast.Attribute):
                here.add(n.attr)
            elif isinstance(n, ast.alias):
                here.update((n.asname or n.name).rsplit(".", 1)[-1:] + n.name.rsplit(".", 1)[-1:])
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 200:
                here.update(part for part in n.value.replace(":", " ").replace(".", " ").split()
                            if part.isidentifier())
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            here.discard(top.name)
        out |= here
    return out


def _is_all(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def names_only_tests_use(files: list[Path], users: list[Path], sources: dict[Path, str] | None = None) -> list[str]:
    """``module.name`` of each public function or class of ``files`` that no file of ``users``
    uses (its own definition aside; ``files`` are users of each other too)."""
    sources = sources or {}
    used = set().union(*(used_names(u, sources.get(u)) for u in {*users, *files}))
    return [f"{_module(f)}.{name}" for f in files for name in public_defs(f, sources.get(f)) if name not in used]


def test_every_public_read_name_has_a_user_outside_tests() -> None:
    files = [f for f in _files([PKG / "read"]) if f.relative_to(PKG / "read").parts[0] in CHECKED]
    found = names_only_tests_use(files, _files(PRODUCTION))
    new = sorted(set(found) - KNOWN)
    assert not new, ("public names only tests use (move them to tests/, e.g. tests/trace_helpers.py, "
                     f"or give them their user): {new}")


def test_the_checker_finds_a_name_only_tests_use(tmp_path: Path) -> None:
    """The checker can fail: a public function called by nothing but itself is found; one called
    from another module, from its own module's other code, or named in a command table's string
    is not; a re-export in a package's ``__init__`` is no use."""
    lib, app, init = ROOT / "dpcore/read/probe_lib.py", ROOT / "dpcore/read/probe_app.py", \
        ROOT / "dpcore/read/probe/__init__.py"  # never written: the sources are passed in
    sources = {
        lib: ("def lonely(n):\n    return lonely(n - 1) if n else 0\n"
              "def called(): return 1\n"
              "def internal(): return 2\n"
              "def by_table(): return 3\n"
              "X = internal()\n"),
        app: ("from dpcore.read.probe_lib import called\n"
              "TABLE = {'c': 'dpcore.read.probe_lib:by_table'}\n"
              "def main(): return called()\n"),
        init: "from dpcore.read.probe_lib import lonely\n__all__ = ['lonely']\n",
    }
    found = names_only_tests_use([lib], [lib, app, init], sources)
    assert found == ["dpcore.read.probe_lib.lonely"]


def test_the_all_ranks_events_reader_is_not_in_the_package() -> None:
    """Every command reads many ranks one rank at a time into tables (dpcore.read.ranks); a
    reader of all ranks' events into one frame is the tests' reference only."""
    defined = {f"{_module(f)}.{n}" for f in _files([PKG]) for n in public_defs(f) + _private_defs(f)
               if n.lstrip("_") in ALL_RANKS_READER}
    assert not defined, f"the all-ranks events reader is back in dpcore/: {sorted(defined)}"
    for info in pkgutil.walk_packages(dpcore.read.traces.__path__, "dpcore.read.traces."):
        mod = importlib.import_module(info.name)
        assert not [n for n in ALL_RANKS_READER if hasattr(mod, n)], info.name
    assert not [n for n in ALL_RANKS_READER if hasattr(dpcore.read.traces, n)]
    imports = [f for f in _files(PRODUCTION) if f.parent.name != "benchmarks" and "tests.trace_helpers" in
               f.read_text(encoding="utf-8")]
    assert not imports, f"the package imports the tests' reader: {imports}"


def _private_defs(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("_")]
