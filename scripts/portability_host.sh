#!/usr/bin/env bash
# One host's row of experiments/portability: the b23-sft recipe retrained and the ACE table's GRPO
# arm from the pinned start, on this host's CPU and, where JAX sees a GPU, on the GPU (default f32
# matmul precision, and "highest"). Each variant runs in its own process and HOME (its own data
# cache), concurrently, under `timeout`.
#   bash scripts/portability_host.sh OUT_DIR [SECONDS]
# Writes OUT_DIR/host.txt, OUT_DIR/err.txt and per variant OUT_DIR/VARIANT/{record.json,*.npz};
# `python -m experiments.portability --add-host OUT_DIR --label NAME` adds them to
# results/portability.
set -u
out=${1:?usage: portability_host.sh OUT_DIR [SECONDS]}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
limit=${2:-480}
py=${PYTHON:-python3}
mkdir -p "$out"
{
  grep -m1 "model name" /proc/cpuinfo; nproc
  nvidia-smi -L 2>/dev/null
  "$py" -c "import jax, sys; print(sys.version.split()[0], 'jax', jax.__version__)"
} > "$out/host.txt" 2>&1
variants=(cpu)
if nvidia-smi -L > /dev/null 2>&1; then variants+=(gpu gpu-highest); fi
for v in "${variants[@]}"; do
  mkdir -p "$out/$v" "/tmp/portability-home-$v"
  case $v in
    cpu) env_v=(JAX_PLATFORMS=cpu) ;;
    gpu) env_v=(JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false) ;;
    gpu-highest) env_v=(JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false
                        JAX_DEFAULT_MATMUL_PRECISION=highest) ;;
  esac
  env "${env_v[@]}" HOME="/tmp/portability-home-$v" timeout "$limit" \
    "$py" -m experiments.portability --variant "$v" --dir "$out/$v" \
    > "$out/$v/record.json" 2>> "$out/err.txt" &
done
wait
for v in "${variants[@]}"; do echo "$v: $(tail -c 400 "$out/$v/record.json")"; done
