#!/usr/bin/env bash
# The checks that need a GPU, run on a machine with one (never by CI, which has none). The machine has Python,
# torch with CUDA, pytest and nvidia-smi but not this project's own wheels: they come prebuilt in .whl/ (for its
# Python), and the generated gRPC stubs come along as built here (the machine may lack grpcio-tools).
#   usage: scripts/device_check.sh [OUT_DIR]      (OUT_DIR: where the log and the figures go; default ./out/device)
# Prepare here first (Python 3.12 wheels, x86-64):
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl grpcio==V protobuf==V highspy==V rustworkx==V   (V: requirements/main.lock)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/device}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_check: the carried wheels did not install"; exit 2; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
touch hpcsched/runtime/proto/*_pb2*.py 2>/dev/null  # newer than the .proto: the stubs are not regenerated there
export PYTHONUNBUFFERED=1
{
  echo "== machine"; nvidia-smi -L; python3 --version
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
  echo "== GPU type a worker advertises (nvidia-smi, hpcsched.runtime.gputype.detect)"
  python3 -c 'from hpcsched.runtime.gputype import detect; import torch; print(detect(torch.cuda.device_count()))'
  echo "== GPU tests (tests/test_runtime_gpu.py, test_runtime_gpu_types.py)"
  python3 -m pytest -q -p no:randomly -p no:cacheprovider -rs --durations=5 tests/test_runtime_gpu.py \
    tests/test_runtime_gpu_types.py
  echo "pytest exit: $?"
  echo "== one GPU vs the CPU: workloads/ddp_train.py, 1 process, 200 steps of the cnn (samples/s from its result)"
  for dev in cuda cpu; do
    d=$(mktemp -d)
    vis=""; [ "$dev" = cpu ] && vis="CUDA_VISIBLE_DEVICES="
    start=$(date +%s.%N)
    env $vis HPCSCHED_CHECKPOINT_DIR="$d" python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
      workloads/ddp_train.py --model cnn --steps 200 >"$d/log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    echo "$dev: exit $rc, wall $(python3 -c "print(round($end-$start,1))") s, result: $(cat "$d/result.json" 2>/dev/null || tail -3 "$d/log")"
  done
} 2>&1 | tee "$out/device_check.log"
