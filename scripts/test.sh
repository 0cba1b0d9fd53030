#!/usr/bin/env bash
# Configures, builds and runs every libengine test under ctest (installing build dependencies first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# The CPU kernels' OpenMP threads sleep when idle instead of spinning: on a shared or oversubscribed machine
# (ctest -j, other builds) libgomp's default spin-wait starves the GEMMs (docs/PERF.md, "Threads for the non-GEMM CPU kernels").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
build_dir=${ENGINE_BUILD_DIR:-build}
# ENGINE_MPI=ON: the data-parallel tests (label mpi) need Open MPI, which install_deps.sh installs.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA="${ENGINE_CUDA:-AUTO}" \
  -DENGINE_MPI="${ENGINE_MPI:-ON}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 900 | tee "$build_dir/ctest.log"
# The transformers round trips skip (exit 77) where their Python packages are missing; install_deps.sh
# installs them, so a skip here is an oracle that never ran: a failure.
if grep -E "(hf_roundtrip|hf_llama_roundtrip|peft_roundtrip|prepare_data) .*Skipped" "$build_dir/ctest.log"; then
  echo "test.sh: a transformers, PEFT or tokenizers round trip was skipped; install_deps.sh should have installed its packages" >&2
  exit 1
fi
# Then the stages after the main suite, each of which a quick local run can leave out:
# - the CUDA kernels on the emulated device (scripts/emulated_cuda.sh, docs/CUDA.md); ENGINE_SKIP_EMULATED_CUDA=1
# - the CPU and emulated-CUDA suites again under ASan + UBSan (docs/RELIABILITY.md); ENGINE_SKIP_SANITIZE=1
# - each file-reader fuzzer for FUZZ_SECONDS (default 60); ENGINE_SKIP_FUZZ=1
if [ "${ENGINE_SKIP_EMULATED_CUDA:-0}" != 1 ]; then
  stage_start=$SECONDS
  bash scripts/emulated_cuda.sh
  echo "test.sh: emulated CUDA stage took $((SECONDS - stage_start)) s"
fi
if [ "${ENGINE_SKIP_SANITIZE:-0}" != 1 ]; then
  stage_start=$SECONDS
  bash scripts/sanitize.sh
  echo "test.sh: sanitizer stage took $((SECONDS - stage_start)) s"
fi
if [ "${ENGINE_SKIP_FUZZ:-0}" != 1 ]; then
  stage_start=$SECONDS
  bash scripts/fuzz.sh
  echo "test.sh: fuzz stage took $((SECONDS - stage_start)) s"
fi
