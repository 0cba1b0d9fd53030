#!/usr/bin/env bash
# Configures, builds and runs every libengine test under ctest (installing build dependencies first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
build_dir=${ENGINE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA="${ENGINE_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 900
