#!/usr/bin/env bash
# The acceptance test of a lent GPU (one NVIDIA GPU, torch 2.11+ with CUDA, no streamlit/plotly
# needed): scripts/gpu_check.py runs every check in one call of about 8 minutes and exits 1 with
# one "FAIL: <check>: <why>" line per failed check; it writes at most five files under $OUT
# (default /tmp/dpcore-gpu-check), rewritten as each check finishes.
# Its docstring lists the checks. Arguments are passed on, e.g. --device cpu for a dry run on
# this machine's CPU, --only gloo-collectives,fsdp-allgather-bytes for a few checks.
#
#   bash scripts/gpu_check.sh            # from anywhere
set -u
# no cd: a relative OUT or --out is where it was called from (the checks' commands run from the
# repository root themselves)
root="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec python3 "$root/scripts/gpu_check.py" "$@"
