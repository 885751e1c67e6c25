#!/usr/bin/env bash
# Issue 29's goal table on one GPU, in parts (each a few minutes; a device call runs one or two):
# the GPU checks, the prefill and decode kernels beside their anchors, and the decode steps.
#
#   benchmarks/runbooks/kernel_and_step_goals.sh checks    # gpu_checks.py, every section
#   benchmarks/runbooks/kernel_and_step_goals.sh prefill   # SSD, GDN prefill beside mamba_ssm, FLA
#   benchmarks/runbooks/kernel_and_step_goals.sh decode    # GDN decode beside FLA; fused decode ops
#   benchmarks/runbooks/kernel_and_step_goals.sh steps     # decode steps, 0.87B and Qwen3-Next
#
# Each part's log goes to $OUT/<part>.log, and each command in it has its own time limit, so one
# that hangs leaves the others' results. The anchors travel with the working tree, git-ignored:
# FLA as .whl/fla_core-0.6.0-*.whl, mamba_ssm's source under .whl_mamba/src.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:=/tmp/out}"
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

install_anchors() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/site:$PWD/.whl_mamba/src"
}

# run SECONDS COMMAND...: one command under a limit, its status logged.
run() {
  local limit=$1
  shift
  echo "### $* (limit ${limit} s)"
  local start=$SECONDS
  timeout "$limit" "$@"
  echo "### status $? after $((SECONDS - start)) s"
}

part=${1:?"a part: checks, prefill, decode or steps"}
export PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
case "$part" in
  checks)
    run 560 python3 benchmarks/gpu_checks.py --jobs 8
    ;;
  prefill)
    install_anchors
    run 560 python3 -m benchmarks.kernels prefill --ops ssd,gdn \
      --configs benchmarks/configs/models_defaults.json
    ;;
  decode)
    install_anchors
    run 150 python3 -m benchmarks.kernels gdn jax "$OUT/gdn_jax.json"
    run 120 python3 -m benchmarks.kernels gdn fla "$OUT/gdn_fla.json"
    run 30 python3 -m benchmarks.kernels gdn table "$OUT/gdn_jax.json" "$OUT/gdn_fla.json"
    run 240 python3 -m benchmarks.kernels fused_decode mamba2,gdn
    ;;
  steps)
    run 250 python3 -m benchmarks.engine decode --size 1b
    run 300 python3 -m benchmarks.engine decode --size qwen3next --batches 1,64,256 --steps 20
    ;;
  *)
    echo "unknown part $part: checks, prefill, decode or steps" >&2
    exit 2
    ;;
esac 2>&1 | tee "$OUT/$part.log"
