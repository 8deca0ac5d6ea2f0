#!/usr/bin/env bash
# Build the Liger companion wheel on the GPU machine (its CPUs: the recorded variants compile on every
# core), from the lock file the record step just wrote; no build isolation (nothing can be fetched there).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .liger/liger_kernel-*.whl \
  dist/hatch_khal-*.whl dist/khal_runtime-*.whl || exit 3
export PYTHONPATH=/tmp/site
KHAL_JOBS=${KHAL_JOBS:-16} python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w dist-liger benchmarks/liger_companion
ls -la dist-liger
