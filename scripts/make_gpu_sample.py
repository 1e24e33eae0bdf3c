"""Cut the committed GPU sample (profiles/sample-gpu) out of a run dpcore recorded on a GPU.

Why: the samples under profiles/ were recorded on CPUs, so a fresh clone's GPU page was empty and
every GPU view test skipped. This keeps a few jobs of a real single-GPU NCCL run (dpcore's own
output, nothing added): their rows of every CSV, their run.json entries and their rank traces.
The merged traces were left out of the recording; a job's ``traces`` list names only what is on
disk. data_parallel stays as it was skipped (a reason a one-GPU user meets); torch_fsdp, skipped
with a reason the recording got wrong, is left out.

    python scripts/make_gpu_sample.py ../shared/gpu/runs/h200_variants_ws1 profiles/sample-gpu
"""
from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

#: Plain compute, DDP's bucketed all-reduce and a sharded job: the GPU page's three shapes.
KEEP = ("single-ws1", "torch_ddp-ws1-b25", "fsdp-ws1", "data_parallel-ws1")
#: Each file of the sample stays under this (the repository holds no big blobs).
MAX_FILE_BYTES = 5 * 1024 * 1024


def _csv_rows(src: Path, dst: Path, jobs: set[str]) -> None:
    with open(src, newline="") as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames or []
        rows = [r for r in reader if "job_id" not in r or r["job_id"] in jobs]
    with open(dst, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def make(src: Path, dst: Path, run_id: str = "sample-gpu") -> Path:
    meta = json.loads((src / "run.json").read_text())
    jobs = [j for j in meta["jobs"] if j["id"] in KEEP]
    kept = {j["id"] for j in jobs}
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "traces").mkdir(parents=True)
    for job in jobs:
        tdir = src / "traces" / job["id"]
        if not tdir.is_dir():
            continue
        (dst / "traces" / job["id"]).mkdir()
        on_disk = []
        for name in job.get("traces", []):
            if (tdir / name).is_file():
                shutil.copyfile(tdir / name, dst / "traces" / job["id"] / name)
                on_disk.append(name)
        job["traces"] = on_disk
        job.pop("merged_trace", None)  # describes the merged file, which the recording left out
    for table in sorted(src.glob("*.csv")):
        _csv_rows(table, dst / table.name, kept)
    meta["run_id"] = run_id
    meta["jobs"] = jobs
    (dst / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    big = [p for p in dst.rglob("*") if p.is_file() and p.stat().st_size > MAX_FILE_BYTES]
    if big:
        raise SystemExit(f"files over {MAX_FILE_BYTES} bytes: {big}")
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python scripts/make_gpu_sample.py <recorded GPU run> <out folder>")
    print(make(Path(sys.argv[1]), Path(sys.argv[2])))
