#!/usr/bin/env bash
# Builds and runs the main job, train_gpt (installing build dependencies first). Arguments go to train_gpt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
build_dir=${ENGINE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA="${ENGINE_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target train_gpt
exec "$build_dir/bench/train_gpt" "$@"
