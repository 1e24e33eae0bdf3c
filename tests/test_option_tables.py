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
    from dpcore.contract.option_fields import field_default, option_fields
    from dpcore.contract.options import COMMAND_OPTIONS

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
    assert AllreduceOptions(**option_values(args, AllreduceOptions)) == AllreduceOptions()
    args = build_parser().parse_args(["profile", "--world-sizes", "1,4", "--no-pin", "--inject-hang", "1:2",
                                      "--bucket-sweep", "1,10", "--timeout", "60"])
    values = option_values(args, ProfileOptions)
    assert values["world_sizes"] == (1, 4) and values["pin"] is False and values["trace"] is True
    assert values["inject_hang"] == (1, 2, "skip")
    assert values["bucket_sweep"] == (1.0, 10.0) and values["timeout_s"] == 60.0


def test_the_read_commands_take_their_options_from_the_fields() -> None:
    from dpcore.cli import _scale, build_parser
    from dpcore.contract.option_fields import option_values
    from dpcore.contract.options import GpuOptions, ScaleOptions

    ap = build_parser()
    args = ap.parse_args(["analyze", "traces", "--csv", "--workers", "2", "--no-cache"])
    assert option_values(args, ScaleOptions) == {"workers": "2", "scheduler": None, "cache": False}
    assert (args.path, args.csv) == ("traces", True)
    scale = _scale(args)
    assert (scale.workers, scale.cache) == (2, False)
    args = ap.parse_args(["gpu", "run", "--kernels"])
    assert option_values(args, GpuOptions) == {"per_step": False, "kernels": True, "collectives": False}
    assert _scale(args).cache is True
    assert ap.parse_args(["summarize", "r"]).run == "r" and ap.parse_args(["hang", "h"]).csv is False
    assert not hasattr(ap.parse_args(["hang", "h"]), "workers")  # hang reads no rank traces
    assert option_values(ap.parse_args(["import", "t", "--no-cache"]), ScaleOptions)["cache"] is False
    args = ap.parse_args(["whatif", "--fabric", "list"])
    assert (args.run, args.fabric, args.algo, args.csv) == (None, "list", "ring", False)
    assert ap.parse_args(["whatif", "r", "--bandwidth-gbps", "5"]).bandwidth_gbps == 5.0
    args = ap.parse_args(["import", "t"])
    assert (args.traces, args.out, args.iteration, args.align_clocks) == ("t", "profiles", None, "auto")
