#!/usr/bin/env bash
# Builds libengine with ENGINE_CUDA=EMULATE in build-emu/ (the CUDA kernels compiled as host C++ and run on
# the emulated device, docs/CUDA.md) and runs the `cuda-emu` suite: every CUDA test, the emulator's own
# tests and its bug-detection tests, and train_gpt --device cuda against the CPU, each kernel launch under
# all five thread schedules. Exits non-zero on any failure or skip.
#   EMULATED_BUILD_DIR  build directory (default build-emu)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${EMULATED_BUILD_DIR:-build-emu}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=EMULATE >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
# The emulator runs a launch on one host thread; OpenBLAS's worker threads (for the emulated cuBLAS and the
# CPU references) would only spin beside the parallel tests on a small machine.
export OPENBLAS_NUM_THREADS=1
ctest --test-dir "$build_dir" -L cuda-emu --output-on-failure -j "$(nproc)" --timeout 900 | tee "$build_dir/cuda-emu.log"
# A skipped CUDA test here would be a test that never ran its kernel: count it as a failure.
if grep -q "(Skipped)" "$build_dir/cuda-emu.log"; then
  echo "emulated_cuda: some cuda-emu tests were skipped; on the emulated device every one must run" >&2
  exit 1
fi
