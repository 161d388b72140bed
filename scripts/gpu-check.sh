#!/usr/bin/env bash
# The checks that need a CUDA GPU, for a GPU machine that has none of our packages and takes at most
# 64 MiB of files per command (the lent H200 of docs/real-targets.md, "A server GPU": Python 3.12, CUDA 13,
# cuda-bindings, numpy, onnx, onnxruntime and pytest there; nothing can be downloaded there).
#
#   bash scripts/gpu-check.sh prepare     # here: fills .gpucheck/A and .gpucheck/B (about 4 min)
#   # then, on the GPU machine, two commands in a row (the machine must stay the same):
#   #   carry .gpucheck/A:  bash scripts/gpu-check.sh unpack-compiler
#   #   carry .gpucheck/B:  bash scripts/gpu-check.sh run      (writes its results under $OUT)
#   #   (then, if device time is left: carry .gpucheck/B:  bash scripts/gpu-check.sh bundles)
#   # The offload check: `prepare` and `prepare-offload` here, then unpack-compiler and `offload`.
#
# Why two: TVM's compiler library alone is 57 MiB xz-compressed (259 MB as it is), and loading a
# CUDA part built on a machine without a GPU needs it (TVM keeps such kernels as CUDA source and
# compiles them with NVRTC when the part loads; docs/real-targets.md, "A server GPU").
# `run` profiles squeezenet and mobilenetv2 (resnet18 is over the 64 MiB a call carries) on devices/server-h200.yaml (--here; the
# measured profiles are what profiles/server-h200/ ships), runs the tests marked cuda, and plans an
# offload with a measured server profile. `bundles` builds and runs benchmarks/server_gpu.py's
# bundles (docs/real-targets.md, "A server GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
G=.gpucheck
SITE=/tmp/gpucheck-site
WHEELS=("apache-tvm-ffi==0.1.14.post0" "jsonschema==4.26.0" "referencing==0.37.0"
  "jsonschema-specifications==2025.9.1" "rpds-py==2026.9.1" "onnxslim==0.1.98" "highspy==1.16.0")

prepare() {
  local tvm
  tvm=$(.venv/bin/python -c 'import tvm, os; print(os.path.dirname(tvm.__file__))')
  rm -rf "$G" && mkdir -p "$G/A" "$G/B/wheels" "$G/B/models"
  echo "compressing libtvm_compiler.so (xz -9, about 3 minutes on 2 cores)"
  xz -9 -T0 -c "$tvm/lib/libtvm_compiler.so" > "$G/A/libtvm_compiler.so.xz"
  tar -C "$(dirname "$tvm")" -cJf "$G/B/tvm.tar.xz" --exclude=tvm/lib/libtvm_compiler.so \
    --exclude=tvm/3rdparty --exclude=__pycache__ tvm $(cd "$(dirname "$tvm")" && ls -d apache_tvm-*.dist-info)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$G/B/wheels" "${WHEELS[@]}"
  .venv/bin/python -c "
from edgesplit.model import zoo
for n in ('squeezenet', 'mobilenetv2'):
    zoo.save(n, '$G/B/models/' + n + '.onnx')"
  du -sh "$G/A" "$G/B"
}

unpack_compiler() {
  mkdir -p "$SITE/tvm/lib"
  xz -dc -T0 "$G/A/libtvm_compiler.so.xz" > "$SITE/tvm/lib/libtvm_compiler.so"
  ls -la "$SITE/tvm/lib"
}

setup_site() {
  [ -s "$SITE/tvm/lib/libtvm_compiler.so" ] || { echo "run unpack-compiler first, on this machine"; exit 4; }
  [ -d "$SITE/tvm/runtime" ] || tar -xJf "$G/B/tvm.tar.xz" -C "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$G"/B/wheels/*.whl
  local cudart
  cudart=$(find /usr/local /opt /usr/lib -name 'libcudart.so.1[0-9]*' 2>/dev/null | head -1)
  export LD_LIBRARY_PATH="$(dirname "$cudart"):${LD_LIBRARY_PATH:-}"
  export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}"
  export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
  OUTDIR="${OUT:-$G/out}"
  mkdir -p "$OUTDIR"
}

ES=(python3 -c 'import sys; from edgesplit.cli.main import main; sys.exit(main())')

run() {
  setup_site
  local out="$OUTDIR"
  (lscpu | grep -E "Model name|^CPU\(s\)" || true; nvidia-smi --query-gpu=name,driver_version --format=csv) | tee "$out/machine.txt"
  local t0
  for m in squeezenet mobilenetv2; do
    t0=$(date +%s)
    timeout 200 "${ES[@]}" profile "$G/B/models/$m.onnx" --device server-h200 --here \
      -o "$out/$m.server-h200.json" 2>&1 | grep -v -i warn | tail -25 | tee "$out/$m.profile.txt" || true
    echo "profile $m: $(( $(date +%s) - t0 )) s wall" | tee -a "$out/$m.profile.txt"
  done
  timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts= -m cuda tests/test_compile_run.py \
    tests/test_profile.py -rs 2>&1 | tail -15 | tee "$out/pytest.txt" || true
  "${ES[@]}" partition "$G/B/models/squeezenet.onnx" --device snapdragon-8gen2 --server server-h200 \
    --server-profile "$out/squeezenet.server-h200.json" --link wifi -o /tmp/plan.json 2>&1 |
    tail -30 | tee "$out/partition.txt" || true
}

# An offload bundle (compiled here by `prepare-offload`: squeezenet, 4 nodes on the host's CPU, the
# rest on server-h200's GPU as a TVM CUDA part) served by `edgesplit serve` on this machine and run
# by `edgesplit run --server` over loopback, against ORT's whole-model output.
offload() {
  setup_site
  local b="$G/B/offload" url=http://127.0.0.1:8765 pid
  "${ES[@]}" serve "$b/bundle" --port 8765 > "$OUTDIR/serve.txt" 2>&1 &
  pid=$!
  for _ in $(seq 240); do grep -q listening "$OUTDIR/serve.txt" && break; sleep 0.5; done
  cat "$OUTDIR/serve.txt"
  for mode in "" --adaptive; do
    timeout 120 "${ES[@]}" run "$b/bundle" --server "$url" --input "input=$b/x.npy" --repeat 200 $mode \
      -o "$OUTDIR/y$mode" 2>&1 | grep -v -i warn | tail -40 | tee "$OUTDIR/run$mode.txt" || true
  done
  python3 - "$G/B/models/squeezenet.onnx" "$b/x.npy" "$OUTDIR" <<'PY' | tee "$OUTDIR/compare.txt"
import sys, pathlib, numpy as np, onnxruntime as ort
model, x, out = sys.argv[1], np.load(sys.argv[2]), pathlib.Path(sys.argv[3])
ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
for d in sorted(out.glob("y*")):
    for f in d.glob("*.npy"):
        y = np.load(f)
        print(d.name, f.name, "max rel error vs ORT", float(np.abs(y - ref).max() / np.abs(ref).max()))
PY
  kill "$pid"; wait "$pid" || true
  tail -5 "$OUTDIR/serve.txt"
}

prepare_offload() {
  local b="$G/B/offload" m="$G/B/models/squeezenet.onnx"
  rm -rf "$b" && mkdir -p "$b"
  .venv/bin/edgesplit partition "$m" --device host --server server-h200 \
    --server-profile profiles/squeezenet.server-h200.profile.json --link wifi --bandwidth-mbps 10000 \
    --rtt-ms 0.1 --pin features.0=cpu -o "$b/plan.json" | tail -3
  .venv/bin/edgesplit compile "$m" --plan "$b/plan.json" -o "$b/bundle" | tail -3
  .venv/bin/python -c "import numpy as np; np.save('$b/x.npy', np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))"
  rm -f "$G/B/models/mobilenetv2.onnx"
  du -sh "$G/B"
}

bundles() {
  setup_site
  timeout 300 python3 benchmarks/server_gpu.py build /tmp/sg 2>&1 | grep -v -i warn | tee "$OUTDIR/build.txt" || true
  python3 benchmarks/server_gpu.py run /tmp/sg --runs 200 --json "$OUTDIR/server_gpu.json" 2>&1 |
    tee "$OUTDIR/server_gpu.txt" || true
}

case "${1:-}" in
  prepare) prepare ;;
  unpack-compiler) unpack_compiler ;;
  run) run ;;
  bundles) bundles ;;
  prepare-offload) prepare_offload ;;
  offload) offload ;;
  *) echo "usage: $0 prepare|unpack-compiler|run|bundles|prepare-offload|offload" >&2; exit 2 ;;
esac
