"""The shape of the code, enforced: three wings that follow the data, and no import cycles.

- ``dpcore/contract``: the run format and the definitions both sides share. No torch, no pandas
  (the writer runs without pandas; the dashboard runs without torch).
- ``dpcore/write``: CLI commands and engine that *write* runs. Never pandas, streamlit, plotly,
  nor anything of the read wing.
- ``dpcore/read``: analysis, plots and dashboard that *read* runs. Never torch, nor the write wing.

Checked twice: statically over every import statement (module level and inside functions, so a
lazy import cannot hide a violation), and at run time in a fresh interpreter (what really ends up
in ``sys.modules``, transitive imports of third-party packages included).

Inside each wing, sub-packages are layers (lowest first); a module imports only its own layer or
lower ones, so a reader can understand each layer from the ones below it alone:

- write: runtime -> capture -> dp -> training -> commands (and no command imports another
  command, only its own parts: profile's per-rank body, record's hooks);
- read: traces, rundir -> analysis -> ranks, tables, whatif, importer, report -> plots -> dashboard, and plots
  import only contract and plots (a figure never recomputes a metric).

And no module uses another module's private (``_name``) names: what is shared is public.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dpcore"
FORBIDDEN = {
    "contract": ("torch", "pandas", "streamlit", "plotly", "dpcore.write", "dpcore.read"),
    "write": ("pandas", "streamlit", "plotly", "dpcore.read"),
    "read": ("torch", "dpcore.write"),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` reads from, a relative one resolved in ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved.

    ``source`` stands in for the file's text, so the checker can be tested on code that is never
    written into the source tree."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            out.append((node.lineno, mod))
            # `from dpcore.read import analysis` imports the submodule dpcore.read.analysis
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names
                    if (PKG.parent / (mod + "." + a.name).replace(".", "/")).exists()
                    or (PKG.parent / ((mod + "." + a.name).replace(".", "/") + ".py")).exists()]
    return out


def _sources() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _violations(imports: list[tuple[int, str]], banned: tuple[str, ...]) -> list[str]:
    return [f"line {ln}: {mod}" for ln, mod in imports
            if any(mod == b or mod.startswith(b + ".") for b in banned)]


@pytest.mark.parametrize("wing", sorted(FORBIDDEN))
def test_wing_imports_follow_the_rules(wing: str) -> None:
    files = sorted((PKG / wing).rglob("*.py"))
    assert files, f"dpcore/{wing} is empty"
    bad = {str(f.relative_to(ROOT)): v for f in files if (v := _violations(_imports(f), FORBIDDEN[wing]))}
    assert not bad, f"dpcore/{wing} breaks its import rule: {bad}"


def test_rule_checker_catches_a_violation(tmp_path: Path) -> None:
    """The checker itself can fail: a lazy torch import inside a function is found."""
    f = PKG / "read" / "_violation_probe.py"  # never written: the source is passed in
    src = "def f():\n    import torch.distributed as dist\n    from dpcore.write.runtime import launch\n"
    got = _violations(_imports(f, src), FORBIDDEN["read"])
    assert got == ["line 2: torch.distributed", "line 3: dpcore.write.runtime", "line 3: dpcore.write.runtime.launch"]


def _graph() -> dict[str, set[str]]:
    mods = {_module_name(f): f for f in _sources()}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for _, imp in _imports(f):
            # an import of a package's submodule depends on that module (not on its parents)
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != m and not m.startswith(imp + ".") and imp != "dpcore":
                graph[m].add(imp)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


_PROBE = """
import importlib, pkgutil, sys
import dpcore.{wing} as w
for m in pkgutil.walk_packages(w.__path__, w.__name__ + "."):
    importlib.import_module(m.name)
print(",".join(sorted(b for b in {banned!r} if b in sys.modules)))
"""


@pytest.mark.parametrize("wing,banned", [("read", ("torch",)), ("contract", ("torch", "pandas")),
                                         ("write", ("pandas", "streamlit", "plotly"))])
def test_wing_loads_without_the_other_sides_libraries(wing: str, banned: tuple[str, ...]) -> None:
    """Import every module of the wing in a fresh interpreter: the banned libraries never load,
    not even through a third-party package."""
    code = _PROBE.format(wing=wing, banned=banned)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"dpcore.{wing} loaded {r.stdout.strip()}"


#: Sub-packages of each wing, lowest layer first; same-rank layers may import each other.
LAYERS: dict[str, dict[str, int]] = {
    "write": {"runtime": 0, "capture": 1, "dp": 2, "training": 3, "commands": 4},
    "read": {"traces": 0, "rundir": 0, "analysis": 1, "ranks": 2, "tables": 2, "whatif": 2, "importer": 2,
             "report": 2, "plots": 3, "dashboard": 4},
}
#: Layers that may import only the listed sub-packages of their wing (besides contract).
ONLY: dict[tuple[str, str], tuple[str, ...]] = {("read", "plots"): ("plots",)}
#: The parts of a command (its module may import them; no other command may).
COMMAND_PARTS = {"profile_rank": "profile", "record_hooks": "record"}


def _layer_violations(path: Path, source: str | None = None) -> list[str]:
    """Imports of ``path`` that break its wing's layer rules, as 'line N: module (why)'."""
    parts = _module_name(path).split(".")
    if len(parts) < 3 or parts[1] not in LAYERS:
        return []
    wing, sub = parts[1], parts[2]
    layers = LAYERS[wing]
    if sub not in layers:
        return [f"{'.'.join(parts)} is in no layer of dpcore.{wing}: add its sub-package to LAYERS"]
    out = []
    for line, mod in _imports(path, source):
        m = mod.split(".")
        if len(m) < 3 or m[:2] != ["dpcore", wing] or m[2] not in layers or m[2] == sub:
            if len(m) >= 4 and m[:3] == ["dpcore", wing, "commands"] and sub == "commands":
                me, other = parts[3] if len(parts) > 3 else "", m[3]
                if other != me and COMMAND_PARTS.get(other) != me:
                    out.append(f"line {line}: {mod} (a command imports another command)")
            continue
        if layers[m[2]] > layers[sub]:
            out.append(f"line {line}: {mod} ({sub} is below {m[2]})")
        elif (wing, sub) in ONLY and m[2] not in ONLY[(wing, sub)]:
            out.append(f"line {line}: {mod} ({sub} imports only {', '.join(ONLY[(wing, sub)])})")
    return out


@pytest.mark.parametrize("wing", sorted(LAYERS))
def test_layers_inside_each_wing(wing: str) -> None:
    files = sorted((PKG / wing).rglob("*.py"))
    bad = {str(f.relative_to(ROOT)): v for f in files if (v := _layer_violations(f))}
    assert not bad, f"dpcore/{wing} breaks its layer rules: {bad}"


def test_layer_checker_catches_violations() -> None:
    """The layer checker can fail: upward imports, a plot importing analysis, command to command."""
    src = "from dpcore.write.commands.profile import x\nfrom dpcore.write.runtime.clock import y\n"
    assert _layer_violations(PKG / "write" / "dp" / "sharding.py", src) == [
        "line 1: dpcore.write.commands.profile (dp is below commands)"]
    src = "def f():\n    from dpcore.read.analysis.metrics import m\n"
    assert _layer_violations(PKG / "read" / "plots" / "overview.py", src) == [
        "line 2: dpcore.read.analysis.metrics (plots imports only plots)"]
    src = "from dpcore.write.commands.profile import record_job\nfrom dpcore.write.commands.record_hooks import h\n"
    assert _layer_violations(PKG / "write" / "commands" / "record.py", src) == [
        "line 1: dpcore.write.commands.profile (a command imports another command)"]
    assert _layer_violations(PKG / "read" / "newthing" / "x.py", "") == [
        "dpcore.read.newthing.x is in no layer of dpcore.read: add its sub-package to LAYERS"]


def _private_uses(path: Path, source: str | None = None) -> list[str]:
    """Uses of another dpcore module's private name in a file, as 'line N: module._name': an
    ``from X import _name`` or an ``m._name`` where ``m`` is a dpcore module (``import X as m``,
    ``from pkg import m``). What a module shares is public, so renaming a private name never
    breaks another module."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    private = lambda n: n.startswith("_") and not n.startswith("__")  # noqa: E731
    modules: dict[str, str] = {}  # local name -> the dpcore module it is bound to
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "dpcore":
                    modules[a.asname or "dpcore"] = a.name if a.asname else "dpcore"
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            if mod.split(".")[0] != "dpcore":
                continue
            for a in node.names:
                if private(a.name) and mod != me:
                    out.append((node.lineno, f"{mod}.{a.name}"))
                modules[a.asname or a.name] = f"{mod}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain, v = [], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in modules:
                owner = ".".join([modules[v.id], *reversed(chain)])
                if owner != me:
                    out.append((node.lineno, f"{owner}.{node.attr}"))
    return [f"line {ln}: {name}" for ln, name in sorted(out)]


def test_no_module_uses_another_modules_private_names() -> None:
    bad = {str(f.relative_to(ROOT)): v for f in _sources() if (v := _private_uses(f))}
    assert not bad, f"private names used across modules (make them public): {bad}"


def test_private_name_checker_catches_violations() -> None:
    """The checker can fail: a private name imported, relatively or lazily, or read through a
    module alias; a module's own private names and dunders are fine."""
    f = PKG / "read" / "ranks" / "probe.py"  # never written: the source is passed in
    src = ("from dpcore.read.traces.reader import _rank_of, trace_files\n"
           "from ..traces import bytescan as bs\n"
           "import dpcore.read.analysis.comm_overlap as co\n"
           "from dpcore.read.ranks.probe import _mine\n"
           "def f():\n"
           "    from .pool import _local\n"
           "    return bs._Scanner, co._by_name, co.__name__, bs.Scanner, _mine\n")
    assert _private_uses(f, src) == [
        "line 1: dpcore.read.traces.reader._rank_of",
        "line 6: dpcore.read.ranks.pool._local",
        "line 7: dpcore.read.analysis.comm_overlap._by_name",
        "line 7: dpcore.read.traces.bytescan._Scanner",
    ]
