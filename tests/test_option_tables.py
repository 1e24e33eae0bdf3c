"""The option tables of docs/cli.md are what the options dataclasses (and so the CLI) say."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "option_tables.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_readme_tables_match_the_options_dataclasses() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_table_and_the_rewrite_fixes_it(tmp_path: Path) -> None:
    readme = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    row = "| `--world-sizes WORLD_SIZES` | `1,2` |"
    assert readme.count(row) == 1, "profile's --world-sizes row with its default 1,2"
    stale = tmp_path / "cli.md"
    stale.write_text(readme.replace(row, "| `--world-sizes WORLD_SIZES` | `1,2,4` |"), encoding="utf-8")
    done = _run("--check", "--readme", str(stale))
    assert done.returncode == 1 and "option tables differ" in done.stderr
    assert _run("--readme", str(stale)).returncode == 0
    assert stale.read_text(encoding="utf-8") == readme


def test_every_option_of_the_dataclasses_is_a_row_with_its_default() -> None:
    from dpcore.commands import COMMAND_OPTIONS
    from dpcore.contract.option_fields import field_default, option_fields

    readme = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for command, groups in COMMAND_OPTIONS.items():
        start = readme.index(f"| `{command}` | default | what it does |")
        block = readme[start:readme.index("\n\n", start)]
        for group in groups:
            for f, spec in option_fields(group.cls):
                line = next((ln for ln in block.splitlines() if ln.startswith(f"| `{spec.flag} ")
                             or ln.startswith(f"| `{spec.flag}`")), None)
                if group.only is not None and f.name not in group.only:
                    continue
                assert line is not None, (command, spec.flag)
                shown = spec.default_text(group.defaults.get(f.name, field_default(f)))
                if not (spec.negate or spec.switch or spec.positional) and shown not in (None, ""):
                    text = f"{shown:g}" if isinstance(shown, float) else str(shown)
                    assert f"| `{text}` |" in line, (command, spec.flag, line)
    assert "| `--sizes SIZES` | `1KB,64KB,1MB,16MB,64MB` |" in readme
    assert "| `--timeout TIMEOUT` | `300` |" in readme
    verify = readme[readme.index("| `verify` | default"):]
    assert "| `--model MODEL` | `toy` |" in verify
    assert "| `--lr LR` |  | learning rate (default the model's) |" in verify
    assert "--bucket-mb" not in verify[:verify.index("\n\n")]  # verify's table only


def test_the_parser_takes_its_defaults_and_values_from_the_fields() -> None:
    from dpcore.cli import build_parser
    from dpcore.contract.option_fields import option_values
    from dpcore.contract.options import AllreduceOptions, ProfileOptions

    args = build_parser().parse_args(["allreduce"])
    assert AllreduceOptions.from_args(args) == AllreduceOptions()
    args = build_parser().parse_args(["profile", "--world-sizes", "1,4", "--no-pin", "--inject-hang", "1:2",
                                      "--bucket-sweep", "1,10", "--timeout", "60"])
    values = option_values(args, ProfileOptions)
    assert values["world_sizes"] == (1, 4) and values["pin"] is False and values["trace"] is True
    assert values["inject_hang"] == (1, 2, "skip")
    assert values["bucket_sweep"] == (1.0, 10.0) and values["timeout_s"] == 60.0


def test_the_read_commands_build_their_options_objects() -> None:
    from dpcore.cli import build_parser
    from dpcore.contract.options import (
        AnalyzeOptions,
        GpuOptions,
        HangOptions,
        ImportOptions,
        SummarizeOptions,
        WhatifOptions,
    )
    from dpcore.read.report.resolve import scale_of

    ap = build_parser()
    opts = AnalyzeOptions.from_args(ap.parse_args(["analyze", "traces", "--csv", "--workers", "2", "--no-cache"]))
    assert opts == AnalyzeOptions(path="traces", csv=True, workers=2, scheduler=None, cache=False)
    scale = scale_of(opts)
    assert (scale.workers, scale.cache) == (2, False)
    gpu = GpuOptions.from_args(ap.parse_args(["gpu", "run", "--kernels"]))
    assert (gpu.path, gpu.per_step, gpu.kernels, gpu.collectives, scale_of(gpu).cache) == ("run", False, True,
                                                                                            False, True)
    assert SummarizeOptions.from_args(ap.parse_args(["summarize", "r"])).run == "r"
    assert HangOptions.from_args(ap.parse_args(["hang", "h"])) == HangOptions(path="h")
    assert not hasattr(ap.parse_args(["hang", "h"]), "workers")  # hang reads no rank traces
    assert ImportOptions.from_args(ap.parse_args(["import", "t", "--no-cache"])).cache is False
    w = WhatifOptions.from_args(ap.parse_args(["whatif", "--fabric", "list"]))
    assert (w.run, w.fabric, w.algo, w.csv, w.world_sizes, w.bucket_mb) == (None, "list", "ring", False, None, None)
    w = WhatifOptions.from_args(ap.parse_args(["whatif", "r", "--bandwidth-gbps", "5", "--world-sizes", "2,8,2",
                                               "--bucket-mb", "1,4"]))
    # parsed once, into tuples: the what-if gets no text to parse again
    assert (w.bandwidth_gbps, w.world_sizes, w.bucket_mb) == (5.0, (2, 8), (1.0, 4.0))
    imp = ImportOptions.from_args(ap.parse_args(["import", "t"]))
    assert (imp.traces, imp.out, imp.iteration, imp.align_clocks) == ("t", "profiles", None, "auto")
    assert imp.command == ()  # not an option: the CLI sets the command line it recorded
