#!/usr/bin/env bash
# Builds and runs the main job, train_gpt (installing build dependencies first). Arguments go to train_gpt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# The CPU kernels' OpenMP threads sleep when idle instead of spinning: on a shared or oversubscribed machine
# (ctest -j, other builds) libgomp's default spin-wait starves the GEMMs (docs/PERF.md, "Threads for the non-GEMM CPU kernels").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
build_dir=${ENGINE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA="${ENGINE_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target train_gpt
exec "$build_dir/bench/train_gpt" "$@"
