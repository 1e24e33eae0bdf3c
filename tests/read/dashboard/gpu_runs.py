"""The GPU runs the dashboard's GPU tests read: the committed sample (profiles/sample-gpu, cut from
an H200 run by scripts/make_gpu_sample.py) always, and the H200 recordings in ../shared/gpu/runs
where that folder exists. Tests read copies of them (the `gpu_runs` fixture), never the folders
themselves.

Why: the GPU views must be tested on a fresh clone too, where ../shared is absent.
"""
from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SAMPLE_GPU = REPO / "profiles" / "sample-gpu"
SHARED_GPU_RUNS = REPO.parent / "shared" / "gpu" / "runs"
#: The recordings of transformer jobs (not host-bound MLPs): the shared run of every variant and
#: the sample cut from it.
TRANSFORMER_RUNS = ("h200_variants_ws1", "sample-gpu")


def _shared() -> list[Path]:
    if not SHARED_GPU_RUNS.is_dir():
        return []
    return sorted(p for p in SHARED_GPU_RUNS.iterdir() if (p / "run.json").is_file())


def gpu_run_folders() -> list[Path]:
    """Where the GPU runs are, the sample first."""
    return ([SAMPLE_GPU] if (SAMPLE_GPU / "run.json").is_file() else []) + _shared()


#: Folder names of the GPU runs (as the run picker knows them).
RUNS = [p.name for p in gpu_run_folders()]


def copy_gpu_runs(dst: Path) -> Path:
    """Copy every GPU run into ``dst`` (a profiles folder of GPU runs only) and return it."""
    dst.mkdir(parents=True, exist_ok=True)
    for src in gpu_run_folders():
        shutil.copytree(src, dst / src.name)
    return dst
