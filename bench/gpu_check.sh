#!/usr/bin/env bash
# One-shot check on a lent GPU machine (no network), in one of two modes (docs/CUDA.md):
# - carried binaries, when gpu_carry/build exists (scripts/prepare_gpu_carry.sh built them here for sm_90 and
#   gathered their shared libraries into gpu_carry/lib): no build. This is the mode that fits a lent machine's
#   15 minutes: its stages' limits add up to at most 6 minutes (`--dry-run` prints them and their total);
# - build from sources: GoogleTest, Google Benchmark (and nlohmann_json) from third_party_src/, then libengine
#   with CUDA for sm_90: the same stages after about 8 minutes of building, which does not fit.
# The stages, in this order, each printing its result as it lands: the GPU and driver; the bf16 headline step
# (GPT-2 124M, B 16, T 1024: tokens/s and MFU beside bench/roofline.py's prediction); the CUDA tests against their
# CPU twins (engine_cuda_tests), the trainer on the device (engine_cuda_trainer_tests) and the no-device behaviour;
# the kernel benchmarks beside their predictions; compute-sanitizer memcheck on the kernel tests (a device or driver
# the sanitizer refuses is a note, not a failure); train_gpt end to end at a few steps (f32 and bf16 with offload,
# a Llama-family model); one rank's NCCL all-reduce against MPI's when the binaries carry MPI. Nothing CI already
# ran on the CPU runs again here. Last a summary: passed / failed / skipped per test binary, the sanitizer's
# verdict, the throughput table, and the overall verdict. A skipped CUDA test is a failure (an old driver makes
# every one of them skip with "no CUDA device"), as is any failed, crashed, timed-out or unrun step.
# Exit status 0 only when the verdict is PASS. Logs go to $OUT (or /tmp/gpu_check), the summary also to
# $OUT/summary.txt. Usage: bench/gpu_check.sh [--dry-run]   (GPU_CHECK_BUDGET_S overrides the stages' total)
set -u
root=$(cd "$(dirname "$0")/.." && pwd)

# The stages of a carried run and each one's time limit in seconds: the budget is their total, at most 360 s.
stages=(
    "gpu 10 the GPU and the driver (nvidia-smi)"
    "headline 60 train_gpt GPT-2 124M, bf16, B 16, T 1024, 8 steps: tokens/s and MFU beside the roofline's prediction"
    "tests_cuda 60 engine_cuda_tests: every CUDA kernel and op against its CPU twin"
    "tests_cuda_trainer 45 engine_cuda_trainer_tests: the trainer on the device, its memory against the planner's"
    "tests_cuda_no_device 15 engine_cuda_no_device_tests with every device hidden"
    "bench_kernels_cuda 40 the kernel benchmarks, bf16 and f32, beside bench/roofline.py's predictions"
    "memcheck 50 compute-sanitizer memcheck on the kernel tests (a refused device is a note)"
    "offload_f32 20 train_gpt GPT-2 124M f32, B 4, T 1024, checkpointing and offload, 4 steps"
    "offload_bf16 20 the same in bf16 with the offload prefetched on the copy stream"
    "llama_smollm 25 train_gpt SmolLM-135M's shape, bf16, T 2048, checkpointing and offload, 4 steps"
    "nccl_allreduce 10 one rank's NCCL all-reduce against MPI's (binaries carried with MPI only)"
)
limit_of() { # NAME: the stage's limit in seconds
    local stage
    for stage in "${stages[@]}"; do
        [ "${stage%% *}" = "$1" ] && { read -r _ limit _ <<<"$stage"; echo "$limit"; return; }
    done
    echo "gpu_check: no stage named $1" >&2
    echo 0
}
stages_total=0
for stage in "${stages[@]}"; do read -r _ limit _ <<<"$stage"; stages_total=$((stages_total + limit)); done
if [ "${1:-}" = --dry-run ]; then
    echo "gpu_check --dry-run: the stages of a carried run (gpu_carry/ from scripts/prepare_gpu_carry.sh), in order"
    for stage in "${stages[@]}"; do
        read -r name limit what <<<"$stage"
        printf '  %-22s %4d s  %s\n' "$name" "$limit" "$what"
    done
    printf '  %-22s %4d s  (%s; the budget is this total unless GPU_CHECK_BUDGET_S says otherwise)\n' total \
        "$stages_total" "$((stages_total / 60)) min $((stages_total % 60)) s"
    [ -d "$root/gpu_carry/build" ] && echo "gpu_carry/ is prepared: $(head -2 "$root/gpu_carry/MANIFEST" | tail -1)" ||
        echo "gpu_carry/ is not prepared here: scripts/prepare_gpu_carry.sh builds it (a source build adds ~8 min)"
    ((stages_total <= 360)) || { echo "gpu_check: the stages add up to more than 6 minutes" >&2; exit 1; }
    exit 0
fi
[ $# -eq 0 ] || { echo "usage: bench/gpu_check.sh [--dry-run]" >&2; exit 2; }
out=${OUT:-/tmp/gpu_check}
work=/tmp/gpu_check_work
prefix=$work/prefix
third=$root/third_party_src
carry=$root/gpu_carry
jobs=$(nproc)
mkdir -p "$out" "$work"
deadline=$((SECONDS + ${GPU_CHECK_BUDGET_S:-$stages_total}))
status_lines=() # one line per step, in order
test_lines=()   # one line per test binary (and the sanitizer), for the summary
failures=()     # why the verdict is FAIL; empty means PASS
headline_line=  # the headline step's tokens/s and MFU, and the prediction
notes=()        # worth knowing, not failures
if [ -d "$carry/build" ]; then
    mode=carried
    build=$carry/build
    # Carried libraries first; the toolkit's own (cudart, cuBLAS) from wherever it is installed there.
    runner=(env "LD_LIBRARY_PATH=$carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
else
    mode=source
    build=$work/build
    runner=()
fi
echo "gpu_check: mode $mode, build $build"

# The GPU and the driver, first: an old driver is the usual reason for every CUDA test to skip.
{
    echo "== GPU and driver =="
    if command -v nvidia-smi >/dev/null 2>&1; then
        timeout 3 nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total,clocks.max.sm \
            --format=csv 2>&1 ||
            timeout 3 nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 ||
            timeout 3 nvidia-smi -L 2>&1
        timeout 3 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1 | sed 's/^/driver supports /'
    else
        echo "nvidia-smi: not found"
    fi
    if [ -r /proc/driver/nvidia/version ]; then
        head -1 /proc/driver/nvidia/version
    else
        echo "/proc/driver/nvidia/version: not present (no NVIDIA kernel driver loaded?)"
    fi
    if [ -x /usr/local/cuda/bin/nvcc ]; then
        echo "toolkit here: $(/usr/local/cuda/bin/nvcc --version | tail -1)"
    fi
    [ "$mode" = carried ] && sed -n 's/^built .* with /carried binaries built with /p' "$carry/MANIFEST" 2>/dev/null
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-(unset)}"
} 2>&1 | tee "$out/gpu.txt"
gpu_line=
for fields in name,driver_version,compute_cap name,driver_version; do
    if query=$(timeout 3 nvidia-smi --query-gpu=$fields --format=csv,noheader 2>/dev/null) && [ -n "$query" ]; then
        gpu_line=$(head -1 <<<"$query")
        break
    fi
done
driver=$(cut -d, -f2 <<<"$gpu_line" | tr -d ' ')
if [[ ${driver%%.*} =~ ^[0-9]+$ ]] && ((${driver%%.*} < 580)); then
    notes+=("driver $driver is older than CUDA 13 needs (R580 or newer) unless a forward-compatibility libcuda is in use: expect \"no CUDA device\" skips")
    echo "gpu_check: ${notes[-1]}"
fi

# run_step NAME LIMIT_S COMMAND...: runs under `timeout`, clipped to what is left of the budget, logging to
# $out/NAME.log and recording a one-line status. Sets step_rc (124 when it timed out or was not run).
step_rc=0
run_step() {
    local name=$1 limit=$2
    shift 2
    local left=$((deadline - SECONDS))
    if ((left < 5)); then
        status_lines+=("$name: not run (budget spent)")
        echo "not run: budget spent" >"$out/$name.log"
        step_rc=124
        return 124
    fi
    ((limit > left)) && limit=$left
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    step_rc=$?
    local how="rc=$step_rc"
    ((step_rc == 124 || step_rc == 137)) && how="timed out (rc=$step_rc, limit $limit s)"
    status_lines+=("$name: $how in $((SECONDS - started)) s (log $out/$name.log)")
    echo "gpu_check: ${status_lines[-1]}"
    return $step_rc
}

# require_ok NAME: the last step's nonzero status fails the verdict.
require_ok() {
    if grep -q '^not run: budget spent' "$out/$1.log" 2>/dev/null; then
        failures+=("$1: not run (budget spent)")
    elif ((step_rc != 0)); then
        failures+=("$1: rc=$step_rc (see $out/$1.log)")
    fi
}

install_source() { # NAME SOURCE_DIR EXTRA_CMAKE_ARGS...
    local name=$1 source=$2
    shift 2
    if [ ! -d "$source" ]; then
        status_lines+=("$name: source $source not carried; relying on an installed copy")
        return 0
    fi
    run_step "deps_$name" 150 bash -c "cmake -S '$source' -B '$work/$name' -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX='$prefix' $* && cmake --build '$work/$name' -j $jobs && cmake --install '$work/$name'"
}

# gtest_summary NAME POLICY [LOG]: counts from a test binary's log (run with --gtest_brief=1) into test_lines,
# and into failures what fails the verdict. POLICY: `cpu` (skips are reported only), `cuda` (a skip is a
# failure, and so is running no test), `no_device` (likewise: it must pass without a device, not skip),
# `sanitized` (as `cuda`, but the exit status is left to the caller: the sanitizer's own errors set it).
# Also sets g_passed, g_failed and g_skipped.
gtest_summary() {
    local name=$1 policy=$2 log=${3:-$out/$1.log} ran passed skipped listed computed reason
    ran=$(sed -n 's/^\[==========\] \([0-9][0-9]*\) tests* from .* ran\..*/\1/p' "$log" 2>/dev/null | tail -1)
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -1)
    skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -1)
    passed=${passed:-0} skipped=${skipped:-0}
    # Failures are listed by name (once in brief mode, twice otherwise): count names once. A test that did
    # not pass and was not skipped failed, listed or not.
    listed=$(grep -a '^\[  FAILED  \] [A-Za-z_]' "$log" 2>/dev/null | sed 's/^\[  FAILED  \] //; s/[ ,(].*//' |
        sort -u | wc -l)
    computed=0
    [ -n "$ran" ] && computed=$((ran - passed - skipped))
    g_failed=$((listed > computed ? listed : computed))
    g_passed=$passed g_skipped=$skipped
    local line
    line=$(printf '%-22s %5d passed, %4d failed, %4d skipped' "$name:" "$passed" "$g_failed" "$skipped")
    if [ -z "$ran" ] && grep -q '^not run: budget spent' "$log" 2>/dev/null; then
        line+="  NOT RUN (budget spent)"
        failures+=("$name: not run (budget spent)")
    elif [ -z "$ran" ]; then
        line+="  INCOMPLETE (rc=$step_rc: crashed, timed out or not run; no gtest summary)"
        failures+=("$name: no gtest summary (rc=$step_rc); see $log")
    elif ((g_failed > 0)); then
        failures+=("$name: $g_failed failed")
    elif ((step_rc != 0)) && [ "$policy" != sanitized ]; then
        failures+=("$name: rc=$step_rc although no test failed (crash at exit?); see $log")
    fi
    if ((skipped > 0)); then
        # In brief mode each skip prints "file:line: Skipped" and its message on the next line.
        reason=$(grep -a -m1 -A1 ': Skipped$' "$log" 2>/dev/null | sed -n 2p)
        line+="  (first skip: ${reason:-no message})"
        if [ "$policy" != cpu ]; then
            failures+=("$name: $skipped skipped (a skipped CUDA test is a failure): ${reason:-no message}")
        fi
    fi
    if [ "$policy" != cpu ] && [ -n "$ran" ] && ((passed == 0)) && ((skipped == 0)); then
        failures+=("$name: no test ran")
    fi
    test_lines+=("$line")
}

# The CUDA test binaries, run directly so that their skips are counted: the kernels and ops against their CPU
# twins, the trainer on the device, and (when built) the no-device behaviour. The CPU tests are CI's, not run here.
run_tests() {
    if [ "$mode" = carried ]; then
        # tests/data is compiled in as an absolute path of the machine that built the binaries.
        local source_root
        source_root=$(cat "$carry/source_root" 2>/dev/null || echo "$root")
        if [ ! -e "$source_root/tests/data" ]; then
            mkdir -p "$(dirname "$source_root")" 2>/dev/null && ln -sfn "$root" "$source_root" 2>/dev/null ||
                notes+=("could not link $source_root to $root; tests reading tests/data will fail")
        fi
    fi
    local suite
    for suite in tests_cuda:engine_cuda_tests tests_cuda_trainer:engine_cuda_trainer_tests; do
        local name=${suite%%:*} binary=$build/tests/${suite#*:}
        if [ -x "$binary" ]; then
            run_step "$name" "$(limit_of "$name")" "${runner[@]}" "$binary" --gtest_brief=1
            gtest_summary "$name" cuda
            echo "gpu_check: ${test_lines[-1]}"
        else
            test_lines+=("$(printf '%-22s %s' "$name:" "NOT BUILT")")
            failures+=("$name: $binary not built")
        fi
    done
    # Optional: the no-device behaviour, with every device hidden. Its tests must pass, not skip.
    local no_device=$build/tests/engine_cuda_no_device_tests
    if [ -x "$no_device" ]; then
        run_step tests_cuda_no_device "$(limit_of tests_cuda_no_device)" env CUDA_VISIBLE_DEVICES= "${runner[@]}" \
            "$no_device" --gtest_brief=1
        gtest_summary tests_cuda_no_device no_device
    else
        test_lines+=("$(printf '%-22s %s' "tests_cuda_no_device:" "not in this build (nothing to run)")")
    fi
}

# compute-sanitizer memcheck over engine_cuda_tests. --report-api-errors no: CUDA API calls that return an
# error are not reported (TooLargeAllocationRaisesOutOfMemory asks cudaMalloc for 2^50 bytes on purpose and
# the engine handles the error; the engine checks every call's status itself, and the tests fail on an
# unexpected one); memcheck's own findings (out-of-bounds or misaligned accesses, hardware exceptions) are
# still errors. Its verdict: exit status 0, "ERROR SUMMARY: 0 errors", and the tests passing, none skipped.
run_memcheck() {
    local sanitizer tests=$build/tests/engine_cuda_tests log=$out/memcheck.log errors api=(--report-api-errors no)
    local filter=() verdict
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ ! -x "$sanitizer" ] || [ ! -x "$tests" ]; then
        test_lines+=("$(printf '%-22s %s' "memcheck:" "NOT RUN (no compute-sanitizer or no engine_cuda_tests)")")
        failures+=("memcheck: not run (no compute-sanitizer at $sanitizer or no engine_cuda_tests)")
        return
    fi
    # The kernel suites only: the ops and trainer tests above run the same kernels, ten to a hundred times slower
    # under the sanitizer than the stage's limit allows.
    local kernels='*KernelTest*:GemmEpilogueTest.*:AttentionSharedMemory.*'
    filter=(--gtest_filter="$kernels")
    if ! "$sanitizer" --help 2>&1 | grep -q -- '--report-api-errors'; then
        api=()
        filter=(--gtest_filter="$kernels-*TooLargeAllocationRaisesOutOfMemory*")
        notes+=("memcheck: $sanitizer has no --report-api-errors; TooLargeAllocationRaisesOutOfMemory left out")
    fi
    run_step memcheck "$(limit_of memcheck)" "${runner[@]}" "$sanitizer" --tool memcheck "${api[@]}" --error-exitcode 1 \
        "$tests" --gtest_brief=1 "${filter[@]}"
    local rc=$step_rc before=${#failures[@]}
    # A sanitizer that refuses this device or driver runs no test: a note, not a failure (issue 32).
    if ! grep -aq '^\[==========\]' "$log" 2>/dev/null &&
        grep -aqiE 'not supported|unsupported|unable to (attach|initiali[sz]e)|incompatible' "$log" 2>/dev/null; then
        notes+=("memcheck: the sanitizer refused this device or driver: $(grep -aiE -m1 'not supported|unsupported|unable to|incompatible' "$log")")
        test_lines+=("$(printf '%-22s %s' "memcheck:" "REFUSED by the sanitizer (a note; see $log)")")
        return
    fi
    errors=$(sed -n 's/^========= ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' "$log" | tail -1)
    gtest_summary memcheck sanitized "$log" # the tests under the sanitizer: same rules as tests_cuda
    unset 'test_lines[-1]'
    if ((rc == 0)) && [ "${errors:-x}" = 0 ] && ((${#failures[@]} == before)); then
        verdict=PASS
    else
        verdict=FAIL
        if [ -z "$errors" ]; then
            failures+=("memcheck: no ERROR SUMMARY (rc=$rc: crashed, timed out or not run); see $log")
        elif ((errors > 0)); then
            failures+=("memcheck: $errors sanitizer errors (rc=$rc); see $log")
        elif ((rc != 0 && ${#failures[@]} == before)); then
            failures+=("memcheck: rc=$rc with 0 sanitizer errors and no failed test; see $log")
        fi
    fi
    test_lines+=("$(printf '%-22s %s: %s sanitizer errors; tests under it %d passed, %d failed, %d skipped (%s)' \
        "memcheck:" "$verdict" "${errors:-?}" "$g_passed" "$g_failed" "$g_skipped" "${api[*]:-no API filter}")")
}

# mean_rate LOG: the mean tokens/s of a train_gpt --log after its first two steps (cache warm-up), or nothing.
mean_rate() {
    awk -F'"tokens_per_second":' 'NF > 1 { split($2, rest, /[,}]/); if (++n > 2) { sum += rest[1]; m++ } }
        END { if (m) printf "%.0f", sum / m }' "$1" 2>/dev/null
}

# The bf16 headline step first (GPT-2 124M, B 16, T 1024, no checkpointing), beside bench/roofline.py's prediction
# (written into the carry when it was prepared, or computed here when python3 is at hand). MFU counts llm.c's
# 6·N + 6·L·C·T FLOPs a token (N = 124,475,904 with the padded head) against 990 TFLOP/s of dense bf16.
headline() {
    local train_gpt=$build/bench/train_gpt log=$out/headline.jsonl rate prediction
    if [ ! -x "$train_gpt" ]; then
        failures+=("headline: train_gpt not built")
        return
    fi
    run_step headline "$(limit_of headline)" "${runner[@]}" "$train_gpt" --device cuda --model gpt2-124M \
        --seq-len 1024 --per-device-train-batch-size 16 --gradient-accumulation-steps 1 --precision bf16 \
        --max-steps 8 --lr-scheduler-type constant --warmup-steps 0 --log "$log"
    require_ok headline
    prediction=$(cat "$carry/headline_prediction.txt" 2>/dev/null ||
        python3 "$root/bench/roofline.py" step --batch 16 --seq 1024 --math bf16 2>/dev/null | tail -1)
    rate=$(mean_rate "$log")
    if [ -n "$rate" ]; then
        headline_line=$(awk -v rate="$rate" 'BEGIN {
            flops = 6 * 124475904 + 6 * 12 * 768 * 1024
            printf "headline: %d tokens/s, MFU %.1f%% of 990 TFLOP/s (bf16, GPT-2 124M, B 16, T 1024)", rate, 100 * rate * flops / 990e12 }')
    else
        headline_line="headline: no steps logged (see $out/headline.log)"
    fi
    headline_line+=$'\n'"  predicted: ${prediction:-unavailable (no carried prediction, no python3)}"
    echo "gpu_check: $headline_line"
}

# train_gpt end to end at a few steps: GPT-2 124M under checkpointing with offload, f32 and bf16 (prefetched), and a
# Llama-family step (RoPE, grouped-query attention, SwiGLU, RMSNorm) at SmolLM-135M's shape. Tokens/s and peak
# memory go in the table.
end_to_end() {
    local train_gpt=$build/bench/train_gpt
    if [ ! -x "$train_gpt" ]; then
        failures+=("end to end: train_gpt not built")
        return
    fi
    local common=(--device cuda --model gpt2-124M --seq-len 1024 --per-device-train-batch-size 4
        --gradient-accumulation-steps 1 --max-steps 4 --lr-scheduler-type constant --warmup-steps 0
        --gradient-checkpointing --every-n-layers 1 --offload)
    run_step offload_f32 "$(limit_of offload_f32)" "${runner[@]}" "$train_gpt" "${common[@]}" --log "$out/offload_f32.jsonl"
    require_ok offload_f32
    run_step offload_bf16 "$(limit_of offload_bf16)" "${runner[@]}" "$train_gpt" "${common[@]}" --precision bf16 \
        --prefetch --log "$out/offload_bf16.jsonl"
    require_ok offload_bf16
    run_step llama_smollm "$(limit_of llama_smollm)" "${runner[@]}" "$train_gpt" --device cuda --model smollm-135m \
        --seq-len 2048 --per-device-train-batch-size 4 --gradient-accumulation-steps 1 --max-steps 4 \
        --lr-scheduler-type constant --gradient-checkpointing --offload --precision bf16 --log "$out/llama_smollm.jsonl"
    require_ok llama_smollm
}

# The NCCL backend, which only a GPU machine can run: one rank's NCCL all-reduce, broadcast and bootstrap over
# MPI, its sums compared bitwise with MPI's (bench/check_communicator.cpp). Needs mpirun on this machine.
check_nccl() {
    local checker=$build/bench/check_communicator
    if ! command -v mpirun >/dev/null 2>&1; then
        notes+=("nccl_allreduce: skipped, mpirun is not installed on this machine (apt-get install openmpi-bin)")
        status_lines+=("nccl_allreduce: skipped (no mpirun)")
        return
    fi
    if [ ! -x "$checker" ]; then
        notes+=("nccl_allreduce: skipped, check_communicator not built (a build without MPI or NCCL)")
        status_lines+=("nccl_allreduce: skipped (check_communicator not built)")
        return
    fi
    run_step nccl_allreduce "$(limit_of nccl_allreduce)" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun --oversubscribe -np 1 "${runner[@]}" "$checker" nccl
    if grep -q "built without" "$out/nccl_allreduce.log"; then
        # The carried binaries leave MPI and NCCL out (scripts/prepare_gpu_carry.sh), as may a source build
        # on a machine without them: nothing to check, not a failure.
        notes+=("nccl_allreduce: skipped, $(grep -o 'built without [A-Z]*' "$out/nccl_allreduce.log" | head -1)")
        return
    fi
    require_ok nccl_allreduce
}

if [ "$mode" = source ]; then
    install_source googletest "$third/googletest" -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON
    install_source benchmark "$third/benchmark" -DBENCHMARK_ENABLE_TESTING=OFF -DBENCHMARK_ENABLE_GTEST_TESTS=OFF \
        -DBENCHMARK_ENABLE_INSTALL=ON -DBENCHMARK_DOWNLOAD_DEPENDENCIES=OFF -DBENCHMARK_ENABLE_WERROR=OFF
    install_source json "$third/json" -DJSON_BuildTests=OFF -DJSON_Install=ON
fi

if [ "$mode" = carried ] ||
    { run_step configure 60 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DENGINE_BUILD_TESTS=ON -DENGINE_BUILD_BENCH=ON -DCMAKE_PREFIX_PATH="$prefix" &&
        run_step build 240 cmake --build "$build" -j "$jobs"; }; then
    headline
    run_tests
    binary=$build/bench/cuda/bench_kernels_cuda
    if [ -x "$binary" ]; then
        run_step bench_kernels_cuda "$(limit_of bench_kernels_cuda)" "${runner[@]}" "$binary" \
            --benchmark_min_time=0.05 --benchmark_out="$out/bench_kernels_cuda.json" --benchmark_out_format=json
        require_ok bench_kernels_cuda
        # A benchmark that calls SkipWithError (e.g. "no CUDA device") still exits 0.
        errored=$(grep -c '"error_occurred": *true' "$out/bench_kernels_cuda.json" 2>/dev/null)
        ((${errored:-0} > 0)) && failures+=("bench_kernels_cuda: $errored benchmarks reported an error (see the table)")
    else
        status_lines+=("bench_kernels_cuda: not built")
        failures+=("bench_kernels_cuda: not built")
    fi
    run_memcheck
    end_to_end
    check_nccl
else
    failures+=("configure or build failed (rc=$step_rc); see $out/configure.log and $out/build.log")
fi

echo "== gpu_check steps =="
printf '%s\n' "${status_lines[@]}"
details=$(grep -a -h -E "^\[  FAILED  \] |ERROR SUMMARY|^========= +(Invalid|Program hit|Malformed|Misaligned|Out of range)" \
    "$out"/tests_*.log "$out"/memcheck.log 2>/dev/null | sort -u | head -30)
[ -n "$details" ] && printf '%s\n' "$details"

# Throughput table against the H200 ceilings: 4.3 TB/s HBM, 67 TFLOP/s fp32, 495 TFLOP/s dense TF32, with the
# roofline model's prediction for each benchmark (bench/roofline.py, written before any GPU run) and the
# measured/predicted ratio: a kernel far above 1.0x is the one that misses its bound.
echo "== throughput (H200 ceilings: 4.3 TB/s, fp32 67 TFLOP/s, tf32 495 TFLOP/s) vs bench/roofline.py =="
python3 "$root/bench/roofline.py" benchmarks >"$out/predicted.json" 2>/dev/null || echo "{}" >"$out/predicted.json"
python3 "$root/bench/roofline.py" step --batch 16 --seq 1024 --math bf16 >"$out/predicted_step.txt" 2>&1
python3 - "$out" <<'PYTHON' || echo "(python3 unavailable: see $out/*.json)"
import glob, json, sys
try:
    predicted = json.load(open(sys.argv[1] + "/predicted.json"))
except (OSError, ValueError):
    predicted = {}
print(f"{'kernel':40s} {'time':>12s} {'throughput':>16s} {'of ceiling':>10s} {'predicted':>12s} {'measured/pred':>13s}")
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        entries = json.load(open(path)).get("benchmarks", [])
    except (OSError, ValueError):
        continue
    for entry in entries:
        name = entry["name"].replace("/manual_time", "")
        if entry.get("error_occurred"):
            print(f"{name:40s} {'error: ' + entry.get('error_message', ''):>40s}")
            continue
        time = f"{entry['real_time']:.1f} {entry['time_unit']}"
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(entry["time_unit"], 1.0)
        expected = predicted.get(name)
        versus = (f" {expected:9.1f} us {entry['real_time'] * scale / expected:12.2f}x" if expected else "")
        if "FLOPS" in entry:
            ceiling = 495e12 if entry.get("label") == "tf32" else 67e12
            print(f"{name:40s} {time:>12s} {entry['FLOPS'] / 1e12:11.1f} TFLOP/s {100 * entry['FLOPS'] / ceiling:9.1f}%{versus}")
        elif "bytes_per_second" in entry:
            rate = entry["bytes_per_second"]
            print(f"{name:40s} {time:>12s} {rate / 1e9:12.0f} GB/s {100 * rate / 4.3e12:9.1f}%{versus}")
        else:
            print(f"{name:40s} {time:>12s}{' ' * 28}{versus}")
# train_gpt JSON lines: the first two steps warm the caches and are left out of the mean.
runs = [(path, "train_gpt 124M B16 T1024 bf16 (headline)") for path in glob.glob(sys.argv[1] + "/headline.jsonl")]
runs += [(path, "train_gpt 124M B4 T1024 offload " + path.rsplit("/", 1)[1][len("offload_"):-len(".jsonl")])
         for path in sorted(glob.glob(sys.argv[1] + "/offload_*.jsonl"))]
runs += [(path, "train_gpt smollm-135m B4 T2048 bf16 offload") for path in glob.glob(sys.argv[1] + "/llama_smollm.jsonl")]
for path, name in runs:
    try:
        steps = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        continue
    steady = steps[2:] or steps
    if not steady:
        print(f"{name:40s} {'no steps logged':>40s}")
        continue
    rate = sum(step["tokens_per_second"] for step in steady) / len(steady)
    peak = max(step["peak_total_mib"] for step in steady)
    print(f"{name:40s} {rate:12.0f} tok/s {peak:10.0f} MiB peak")
try:  # the model's whole step for the headline run (B=16, bf16), last line of its report
    print("predicted step:", open(sys.argv[1] + "/predicted_step.txt").read().strip().splitlines()[-1])
except (OSError, IndexError):
    pass
PYTHON

# The summary comes last, so that it is in the tail of the output.
{
    echo "== summary =="
    echo "gpu: ${gpu_line:-unknown (nvidia-smi missing or failing; see $out/gpu.txt)} (name, driver, compute capability)"
    [ -n "$headline_line" ] && echo "$headline_line"
    printf '%s\n' "${test_lines[@]}"
    ((${#notes[@]})) && printf 'note: %s\n' "${notes[@]}"
    if ((${#failures[@]} == 0)); then
        echo "== verdict: PASS =="
    else
        echo "== verdict: FAIL (${#failures[@]}) =="
        printf '  - %s\n' "${failures[@]}"
    fi
} | tee "$out/summary.txt"
((${#failures[@]} == 0))
