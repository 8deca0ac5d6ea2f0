#!/usr/bin/env bash
# CUDA 12 on the GPU machine: kernels built with NVRTC 12 (nvidia-cuda-nvrtc-cu12, PTX ISA 8.x)
# run by khal_runtime on cuda-bindings 12.9 (the lent H200's own Python has cuda-bindings 13.x;
# 12.9 goes into a target folder of its own, ahead of it on PYTHONPATH).
#
#   scripts/device-cu12.sh prepare   # here, with network: fills .whl-cu12/ and dist-cu12/
#   scripts/device-cu12.sh run       # on the GPU machine (no network), carrying both folders
#
# prepare builds, with isolated pip builds (NVRTC and the header wheels come from PyPI):
#   dist-cu12/hatch_khal-*.whl, khal_runtime-*.whl   this checkout
#   dist-cu12/example_shader_pkg-*.whl         the example, nvrtc-requirement = $NVRTC, cubin for
#                                              $ARCHS (default sm_90) + PTX compute_75
#   dist-cu12/ptx-only/example_shader_pkg-*.whl  the same with a cubin for sm_80 only: on an sm_90
#                                              GPU the runtime can only load the PTX (driver JIT)
#   dist-cu12/khal_real_kernels-*.whl          tests/packages/real_kernels_pkg with its own NVRTC 13.0 pin
#                                              (its <thrust/complex.h> does not compile with CUDA
#                                              12.9's CCCL under NVRTC: thrust includes <iterator>),
#                                              so that its GPU tests run on cuda-bindings 12.9 too
# and checks that every PTX of the example wheels says `.version 8.`; .whl-cu12/ gets the cp312 wheels the GPU
# machine lacks (those of ../shared/tools/device-wheels.sh) plus cuda-bindings 12.9 and
# cuda-pathfinder. Both folders are git-ignored.
#
# run installs .whl-cu12 + hatch-khal into /tmp/khal-cu12-site, checks that cuda.bindings is 12.x,
# then: `pytest -m gpu tests` against the cu12 example wheel (and real-kernels wheel), a probe
# that launches saxpy from the PTX-only wheel and prints which binary each crate loaded, and the
# example-kernel GPU tests against the PTX-only wheel. Logs go to $OUT (or /tmp/device-cu12);
# the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
NVRTC=${KHAL_CU12_NVRTC:-nvidia-cuda-nvrtc-cu12~=12.9}
ARCHS=${KHAL_CU12_ARCHS:-sm_90}
PY=${PYTHON:-python3}

prepare() {
  set -e
  rm -rf dist-cu12 .whl-cu12 && mkdir -p dist-cu12/ptx-only .whl-cu12
  local tmp
  tmp=$(mktemp -d)
  "$PY" -m pip wheel -q --no-deps -w dist-cu12 . ./runtime
  cp -r example_shader_pkg "$tmp/ex" && cp -r tests/packages/real_kernels_pkg "$tmp/real"
  rm -rf "$tmp"/*/*/_khal
  sed -i "s/^nvrtc-requirement = .*/nvrtc-requirement = \"$NVRTC\"/" "$tmp/ex/pyproject.toml"
  grep -q "^nvrtc-requirement = \"$NVRTC\"" "$tmp/ex/pyproject.toml"
  local w=("$PY" -m pip wheel -q --no-deps --find-links dist-cu12)
  KHAL_CUDA_ARCHS=$ARCHS "${w[@]}" -w dist-cu12 "$tmp/ex" "$tmp/real"
  KHAL_CUDA_ARCHS=sm_80 "${w[@]}" -w dist-cu12/ptx-only "$tmp/ex"
  rm -rf "$tmp"
  "$PY" - <<'EOF'
import glob, json, zipfile
for whl in sorted(glob.glob("dist-cu12/**/example_shader_pkg-*.whl", recursive=True)):
    with zipfile.ZipFile(whl) as zf:
        ptx = [n for n in zf.namelist() if n.endswith(".ptx")]
        bad = [n for n in ptx if not zf.read(n).decode().split(".version ", 1)[1].startswith("8.")]
        (m,) = [n for n in zf.namelist() if n.endswith("_khal/manifest.json")]
        tc = json.loads(zf.read(m))["toolchain"]
    assert ptx and not bad and tc["nvrtc_version"].startswith("12."), (whl, bad, tc)
    print(f"{whl}: NVRTC {tc['nvrtc_version']}, {len(ptx)} PTX files, all .version 8.x")
EOF
  # the pure / cp312 wheels the GPU machine lacks (../shared/tools/device-wheels.sh's list), plus
  # cuda-bindings 12.9 instead of the machine's 13.x
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl-cu12 \
    pydantic pydantic-core annotated-types typing-inspection hatchling pathspec pluggy trove-classifiers \
    tomli editables filelock platformdirs pyelftools packaging 'cuda-bindings~=12.9.0' cuda-pathfinder
  ls .whl-cu12 dist-cu12 dist-cu12/ptx-only
  du -sh .whl-cu12 dist-cu12
}

run() {
  local out=${OUT:-/tmp/device-cu12} site=/tmp/khal-cu12-site
  mkdir -p "$out"
  if [ ! -d "$site/cuda/bindings" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl-cu12/*.whl \
      dist-cu12/hatch_khal-*.whl dist-cu12/khal_runtime-*.whl >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
  fi
  export PYTHONPATH=$PWD:$site${PYTHONPATH:+:$PYTHONPATH}
  local ex ptx real
  ex=$(ls "$PWD"/dist-cu12/example_shader_pkg-*.whl)
  ptx=$(ls "$PWD"/dist-cu12/ptx-only/example_shader_pkg-*.whl)
  real=$(ls "$PWD"/dist-cu12/khal_real_kernels-*.whl 2>/dev/null || true)
  "$PY" - <<'EOF' 2>&1 | tee "$out/versions.txt"
import cuda.bindings, cuda.bindings.driver as d
err, v = d.cuDriverGetVersion()
print(f"cuda.bindings {cuda.bindings.__version__} from {cuda.bindings.__path__[0]}; driver CUDA {v // 1000}.{v % 1000 // 10}")
assert cuda.bindings.__version__.startswith("12."), "cuda-bindings 12.x is not the one imported"
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
  KHAL_TEST_EXAMPLE_WHEEL=$ex KHAL_TEST_REAL_WHEEL=$real \
    "$PY" -m pytest -m gpu -q -p no:cacheprovider tests "$@" >"$out/gpu.log" 2>&1
  # the PTX-only wheel: which binary each crate loads, and a launch checked against NumPy
  local probe=$out/ptx-site
  rm -rf "$probe" && mkdir -p "$probe" && (cd "$probe" && "$PY" -m zipfile -e "$ptx" .)
  PYTHONPATH=$probe:$PYTHONPATH "$PY" - >"$out/ptx-probe.txt" 2>&1 <<'EOF'
import numpy as np
import khal_runtime
import khal_runtime.backends.cuda.loader as L
real = L._load_artifact
def spy(crate, dev, art, data):
    m = real(crate, dev, art, data)
    print(f"crate {crate.name}: loaded {art.kind} {art.arch} (PTX ISA {art.ptx_isa})")
    return m
L._load_artifact = spy
import example_shader_pkg as e
x = khal_runtime.DeviceBuffer.from_numpy(np.arange(1000, dtype=np.float32))
y = khal_runtime.DeviceBuffer.from_numpy(np.ones(1000, dtype=np.float32))
e.kernels.saxpy(1000, x, y, e.SaxpyParams(a=2.0))
got = y.to_numpy()
assert np.allclose(got, 2 * np.arange(1000) + 1), got[:5]
print("saxpy from the PTX-only cu12 wheel: OK")
EOF
  echo "probe rc=$?" >>"$out/ptx-probe.txt"
  KHAL_TEST_EXAMPLE_WHEEL=$ptx "$PY" -m pytest -m gpu -q -p no:cacheprovider \
    tests/runtime/cuda/test_example_kernels_gpu.py tests/runtime/cuda/test_cccl_kernels_gpu.py >"$out/gpu-ptx.log" 2>&1
  echo "== $(cat "$out/versions.txt")"
  echo "== gpu tests, cu12 wheels (cubin sm_90 + PTX):"; grep -E "^(FAILED|ERROR)" "$out/gpu.log" | head -20
  tail -1 "$out/gpu.log"
  echo "== PTX-only cu12 wheel:"; cat "$out/ptx-probe.txt" | tail -8
  grep -E "^(FAILED|ERROR)" "$out/gpu-ptx.log" | head -10; tail -1 "$out/gpu-ptx.log"
}

what=${1:-}
shift || true
case $what in
  prepare) prepare ;;
  run) run "$@" ;;
  *) echo "usage: scripts/device-cu12.sh prepare|run [pytest args]" >&2; exit 2 ;;
esac
