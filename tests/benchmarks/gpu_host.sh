#!/usr/bin/env bash
# The GPU figures of issue 92, in one run of at most 8 minutes on a host of
# one NVIDIA GPU (an H200 first), writing everything under $OUT (default
# ./gpu_out). Not yet run: no GPU has been lent to this project's sessions.
#
#   OUT=/tmp/out bash tests/benchmarks/gpu_host.sh
#
# The image lacks ml-collections: carry its wheel (and absl's, if missing)
# in .whl-gpu/ and this installs it under /tmp/site, after the image's JAX.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu_out}"
mkdir -p "$out"
if ls .whl-gpu/*.whl >/dev/null 2>&1; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index \
    --no-deps --no-compile --target /tmp/site .whl-gpu/*.whl
  export PYTHONPATH="${PYTHONPATH:-}:/tmp/site"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import jax; print("jax", jax.__version__, jax.devices())'
} > "$out/host.txt" 2>&1

# 1. The default job as it comes: exit 0, the GPU named on its lines.
timeout 90 python3 -m launcher --config=configs/linear_regression.py \
  --workdir=/tmp/gpu_default > "$out/default_job.log" 2>&1
echo "default job exit $?" >> "$out/summary.txt"

# 2. The decoder LM: podrun against a hand-written jit loop, MFU on the
#    step line against the kind's peak (989 on an H200).
timeout 200 python3 tests/benchmarks/benchmark_chip.py --workload=lm \
  --methods=podrun_pmap,hand --rounds=3 --steps=60 \
  --out="$out/lm.json" > "$out/lm.log" 2>&1
echo "lm exit $?" >> "$out/summary.txt"

# 3. The MNIST MLP with its defaults against its resident scan.
timeout 120 python3 tests/benchmarks/benchmark_chip.py --workload=mnist \
  --methods=podrun_pmap,resident_scan --rounds=2 --mnist_steps=2000 \
  --out="$out/mnist.json" > "$out/mnist.log" 2>&1
echo "mnist exit $?" >> "$out/summary.txt"

# 4. The checkpoint tiers: the local tier's copy and restore (GB/s on the
#    restore line), against none.
timeout 90 python3 tests/benchmarks/benchmark_chip.py --mode=checkpoints \
  --checkpoints=none,defaults --steps=60 \
  --out="$out/checkpoints.json" > "$out/checkpoints.log" 2>&1
echo "checkpoints exit $?" >> "$out/summary.txt"

# 5. The accelerator tier's tests on the GPU.
timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/test_accelerator_processes.py > "$out/accelerator.log" 2>&1
echo "accelerator tier exit $?" >> "$out/summary.txt"
cat "$out/summary.txt"
