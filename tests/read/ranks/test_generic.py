"""ranks/ is generic: it reads the tables its callers hand it and imports none of their code.

Why: the per-rank reader (reduce, cache, pool) serves every consumer; if it imports an analysis
module to name that consumer's table, or holds a function per consumer, each new reader edits
ranks/ and ranks/ depends on everything above it. Consumers declare their tables
(:class:`~dpcore.read.traces.rank_table.RankTable`) and hand them in (``need``, ``eager``);
the declarations and per-consumer reads are :mod:`dpcore.read.tables`'s. Checked over every
import statement of every module under dpcore/read/ranks, lazy ones inside functions included.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RANKS = ROOT / "dpcore" / "read" / "ranks"
#: What ranks/ must not import: the consumers of its tables (and the one module that names them).
FORBIDDEN = ("dpcore.read.analysis", "dpcore.read.report", "dpcore.read.dashboard", "dpcore.read.tables",
             "dpcore.read.importer", "dpcore.read.whatif", "dpcore.read.plots")


def consumer_imports(source: str) -> list[str]:
    """'line N: module' of each import in ``source`` of a module under :data:`FORBIDDEN`
    (``from dpcore.read import analysis`` counts as importing dpcore.read.analysis)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        bad = sorted({n for n in names for f in FORBIDDEN if n == f or n.startswith(f + ".")})
        out += [f"line {node.lineno}: {n}" for n in bad[:1]]
    return out


def test_ranks_imports_no_consumer_of_its_tables() -> None:
    files = sorted(RANKS.rglob("*.py"))
    assert len(files) >= 4  # __init__, cache, pool, reduce
    bad = {str(f.relative_to(ROOT)): v for f in files if (v := consumer_imports(f.read_text(encoding="utf-8")))}
    assert not bad, f"dpcore/read/ranks imports a consumer of its tables (hand the tables in instead): {bad}"


def test_ranks_has_no_per_consumer_function() -> None:
    """The names a consumer's read had in ranks/ are gone from it (they live in dpcore.read.tables)."""
    import dpcore.read.ranks as ranks
    import dpcore.read.ranks.pool as pool

    gone = ("EAGER", "GPU_TABLES", "job_lanes", "job_lane_events", "run_trace_steps", "run_steps_gpu", "run_gpu",
            "folder_gpu")
    assert not [n for n in gone if hasattr(ranks, n) or hasattr(pool, n)]


def test_the_checker_finds_consumer_imports() -> None:
    src = ("from __future__ import annotations\n"
           "import dpcore.read.analysis.lanes\n"
           "from dpcore.read.analysis.gpu_time import GPU_TABLE\n"
           "from dpcore.read import analysis\n"
           "from dpcore.read.traces.rank_table import RankTable\n"
           "def f():\n    from dpcore.read.report import gpu\n"
           "from . import cache\n")
    assert consumer_imports(src) == ["line 2: dpcore.read.analysis.lanes", "line 3: dpcore.read.analysis.gpu_time",
                                     "line 4: dpcore.read.analysis", "line 7: dpcore.read.report"]
