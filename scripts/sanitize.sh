#!/usr/bin/env bash
# Builds the library on the emulated CUDA device (ENGINE_CUDA=EMULATE) and its whole test suite, the CPU tests
# and the `cuda-emu` ones, with AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/ and runs it under
# ctest: an out-of-bounds access inside a CUDA kernel is caught here byte-exactly. The CUDA tests replay each
# launch under the round-robin schedule only here (scripts/emulated_cuda.sh runs all five without ASan).
# Exits non-zero on any failing test or sanitizer finding.
#   SANITIZE_BUILD_DIR  build directory (default build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SANITIZE_BUILD_DIR:-build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

# ENGINE_MPI=OFF: Open MPI's own allocations would read as leaks, and this build then checks the library
# without MPI (the communicator's "built without MPI" error); the main build runs the MPI tests.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGINE_CUDA=EMULATE -DENGINE_BUILD_BENCH=OFF \
  -DENGINE_MPI=OFF \
  -DENGINE_EMULATOR_TEST_SCHEDULES=round-robin \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

# allocator_may_return_null: the out-of-memory tests ask for 2^60 bytes and expect the engine's own
# OutOfMemoryError, which needs malloc to fail the ordinary way instead of ASan aborting first.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# downstream_find_package installs and builds a separate project with the default flags; it checks
# packaging, not memory safety, and the main ctest run covers it.
# The emulator runs a launch on one host thread; OpenBLAS's worker threads (for the emulated cuBLAS and the
# CPU references) would only spin beside the parallel tests on a small machine.
export OPENBLAS_NUM_THREADS=1
# The trainer's tier runs (tests/cuda_trainer) take 30-200 s each under ASan (measured 2026-12-03, docs/PERF.md
# "CI"): it checks the one bitwise run and the two memory runs that pass through the tiers' code (streamed
# gradients and parameters with their prefetch, window gradients, bf16, GPT-2, activation offload), and the
# emulated stage runs them all without ASan, as it does the allocator's steady-state step (78 s here). The
# streaming LM head keeps its op tests and one memory run (gpt_bf16_loss_chunks, through the streamed tiers)
# here; its trainer runs on the device (19 s emulated) run in the emulated stage. So does the tiled MLP: its op and
# CPU trainer tests and one memory run (gpt_bf16_mlp_tiles) here, its device trainer runs (19 s) there.
tiers_left_out='OffloadOptimizer\.BitwiseTheAllOnDeviceRunWithTheStateOnTheHost/(gpt_fp32|gpt_bf16_checkpointed|llama_fp32_checkpointed|llama_bf16|llama_tied_bf16|gpt_bf16_streamed|llama_fp32_streamed|llama_tied_fp32_parameters|gpt_bf16_loss_chunks_streamed|llama_tied_fp32_loss_chunks)( |$)|OffloadOptimizerInput\.PlacementIsChecked$|StreamingHeadOnDevice\.TrainsAsTheWholeLogits$|TiledMlpOnDevice\.TrainsAsTheWholeMlp$'
memory_left_out='DeviceMemory\.TheTiersCostIsPredictedToTheByte/(gpt_fp32|llama_fp32_checkpoint|llama_bf16|gpt_bf16_streamed|llama_fp32_streamed|llama_fp32_streamed_parameters|llama_fp32_loss_chunks|llama_fp32_mlp_tiles)( |$)'
# The step's census counts what a step launches (96 s here, 7 s in the emulated stage, which runs it); the trainer steps
# it takes are the ones the tests above check for memory errors.
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 900 \
  -E "^downstream_find_package\$|^GptCudaAllocator\.SteadyStateStepMakesNoSystemAllocation\$|^StepCensus\.|$tiers_left_out|$memory_left_out"
