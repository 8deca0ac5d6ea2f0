#!/usr/bin/env bash
# Liger-Kernel against a hatch-khal companion, on the GPU machine (#36, "Real client").
#   benchmarks/liger_gpu.sh record     Liger's tests under Triton's JIT, recording every launch into
#                                      benchmarks/liger_companion/khal-triton.lock (copied to $OUT)
#   benchmarks/liger_gpu.sh companion  the same tests with the companion wheel (dist-liger/) installed,
#                                      Triton's compiler unreachable, KHAL_TRITON_STATS=1 counting
# Liger's tests are not in this repository: .liger/ holds Liger's test files at the tag of the installed
# release (git archive of linkedin/Liger-Kernel v0.8.2) and its wheel; neither is committed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TESTS="test/transformers/test_rms_norm.py test/transformers/test_layer_norm.py test/transformers/test_swiglu.py
       test/transformers/test_geglu.py test/transformers/test_rope.py test/transformers/test_cross_entropy.py"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .liger/liger_kernel-*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PYTEST="python3 -m pytest -q -p no:cacheprovider -c /dev/null --rootdir . -n ${LIGER_JOBS:-8} $TESTS"
case "${1:-}" in
  record)
    (cd .liger && python3 -m hatch_khal triton record --project ../benchmarks/liger_companion -- $PYTEST) \
      2>&1 | tee "$OUT/liger-record.log" | tail -40
    cp benchmarks/liger_companion/khal-triton.lock* "$OUT/" ;;
  companion)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site dist-liger/*.whl || exit 3
    export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/liger_companion KHAL_TRITON_STATS=1 \
      KHAL_LIGER_STATS_DIR=/tmp/liger-stats
    (cd .liger && $PYTEST -p khal_liger_plugin) 2>&1 | tee "$OUT/liger-companion.log" | tail -60
    python3 benchmarks/liger_counts.py /tmp/liger-stats benchmarks/liger_companion/khal-triton.lock.launches.json ;;
  *) echo "usage: $0 record|companion" >&2; exit 2 ;;
esac
