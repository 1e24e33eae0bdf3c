#!/usr/bin/env bash
# Regenerate the sample runs committed under profiles/ (CPU, gloo, 2 ranks; a few minutes).
# They give every dashboard view data on a fresh clone:
#   profiles/sample-train      every variant at world sizes 1 and 2, plus a short bucket sweep;
#                              Adam, so the Memory view shows what ZeRO-1 and FSDP save
#   profiles/sample-allreduce  the all-reduce bandwidth benchmark at 2 ranks
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf profiles/sample-train profiles/sample-allreduce
# The bucket sweep must show the trade: the mlp at width 256 has 3.77 MiB of gradients (15 layers
# of 257 KiB + a 10 KiB head), so --bucket-mb 0.25, 1, 2 and the default 25 make 30, 5, 3 and 1
# bucket(s) for `bucketed` and 15, 4, 2, 1 for torch_ddp (dpcore/contract/buckets.py); 4 MB and up
# would all be one bucket, which is why the old sweep 1,4 (+25) showed no trade.
python -m dpcore profile --run-id sample-train --model mlp --width 256 --variants all --optimizer adam \
  --world-sizes 1,2 --steps 10 --warmup 3 --profile-steps 2 --bucket-mb 25 --bucket-sweep 0.25,1,2 --out profiles
python -m dpcore allreduce --run-id sample-allreduce --algos native,ring,naive,central \
  --world-sizes 2 --sizes 1KB,16KB,256KB,1MB,4MB,16MB --out profiles
du -sh profiles/sample-train profiles/sample-allreduce
