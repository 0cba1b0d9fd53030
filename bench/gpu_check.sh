#!/usr/bin/env bash
# One-shot check on a lent GPU machine (no network), in one of two modes (docs/CUDA.md):
# - carried binaries, when gpu_carry/build exists (scripts/prepare_gpu_carry.sh built them here for sm_90 and
#   gathered their shared libraries into gpu_carry/lib): no build; the test binaries run directly (ctest's
#   files hold this machine's paths), with a pass/fail summary;
# - build from sources: GoogleTest, Google Benchmark (and nlohmann_json) from third_party_src/, then
#   libengine with CUDA for sm_90, then the whole ctest suite.
# Then, either way: compute-sanitizer memcheck over the CUDA tests, the kernel and train-step benchmarks,
# train_gpt under checkpointing with and without offload (and prefetch, once train_gpt has the flag), and a
# throughput table last. Whole run bounded by an 8-minute budget; logs go to $OUT (or /tmp/gpu_check).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_check}
work=/tmp/gpu_check_work
prefix=$work/prefix
third=$root/third_party_src
carry=$root/gpu_carry
jobs=$(nproc)
mkdir -p "$out" "$work"
deadline=$((SECONDS + ${GPU_CHECK_BUDGET_S:-480}))
status_lines=()
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

# run_step NAME LIMIT_S COMMAND...: runs under `timeout`, clipped to what is left of the budget, logging to
# $out/NAME.log and recording a one-line status.
run_step() {
    local name=$1 limit=$2
    shift 2
    local left=$((deadline - SECONDS))
    if ((left < 5)); then
        status_lines+=("$name: skipped (budget spent)")
        return 124
    fi
    ((limit > left)) && limit=$left
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    status_lines+=("$name: rc=$rc in $((SECONDS - started)) s (log $out/$name.log)")
    return $rc
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

# gtest_summary NAME: one line from a test binary's log (run with --gtest_brief=1).
gtest_summary() {
    local log=$out/$1.log passed skipped failed
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    # Each failure is listed twice (as it happens, with its time, and at the end): count names once.
    failed=$(grep '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/ (.*//' | sort -u | wc -l)
    status_lines+=("$1: ${passed:-0} passed, ${skipped:-0} skipped, $failed failed")
}

# Runs the whole test suite: ctest from a source build, the two gtest binaries directly when carried.
run_tests() {
    if [ "$mode" = source ]; then
        run_step ctest 120 ctest --test-dir "$build" --output-on-failure -j 4
        return
    fi
    # tests/data is compiled in as an absolute path of the machine that built the binaries.
    local source_root
    source_root=$(cat "$carry/source_root" 2>/dev/null || echo "$root")
    if [ ! -e "$source_root/tests/data" ]; then
        mkdir -p "$(dirname "$source_root")" 2>/dev/null && ln -sfn "$root" "$source_root" 2>/dev/null ||
            status_lines+=("note: could not link $source_root to $root; tests reading tests/data will fail")
    fi
    run_step tests_cpu 150 "${runner[@]}" "$build/tests/engine_tests" --gtest_brief=1
    gtest_summary tests_cpu
    run_step tests_cuda 120 "${runner[@]}" "$build/tests/engine_cuda_tests" --gtest_brief=1
    gtest_summary tests_cuda
}

# train_gpt on GPT-2 124M under checkpointing: offload off, offload through the compute stream, and with
# prefetching on the copy stream when train_gpt has --prefetch. Tokens/s and peak memory go in the table.
measure_offload() {
    local train_gpt=$build/bench/train_gpt
    if [ ! -x "$train_gpt" ]; then
        status_lines+=("offload: train_gpt not built")
        return
    fi
    local common=(--device cuda --model gpt2-124M --seq-len 1024 --per-device-train-batch-size 4
        --gradient-accumulation-steps 1 --max-steps 8 --lr-scheduler-type constant --warmup-steps 0
        --gradient-checkpointing --every-n-layers 1)
    run_step offload_none 60 "${runner[@]}" "$train_gpt" "${common[@]}" --log "$out/offload_none.jsonl"
    run_step offload_compute_stream 60 "${runner[@]}" "$train_gpt" "${common[@]}" --offload \
        --log "$out/offload_compute_stream.jsonl"
    if "${runner[@]}" "$train_gpt" --help 2>&1 | grep -q -- '--prefetch'; then
        run_step offload_prefetch 60 "${runner[@]}" "$train_gpt" "${common[@]}" --offload --prefetch \
            --log "$out/offload_prefetch.jsonl"
    else
        status_lines+=("offload_prefetch: skipped (train_gpt has no --prefetch flag yet)")
    fi
}

if [ "$mode" = source ]; then
    install_source googletest "$third/googletest" -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON
    install_source benchmark "$third/benchmark" -DBENCHMARK_ENABLE_TESTING=OFF -DBENCHMARK_ENABLE_GTEST_TESTS=OFF \
        -DBENCHMARK_ENABLE_INSTALL=ON -DBENCHMARK_DOWNLOAD_DEPENDENCIES=OFF -DBENCHMARK_ENABLE_WERROR=OFF
    install_source json "$third/json" -DJSON_BuildTests=OFF -DJSON_Install=ON
fi

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1

if [ "$mode" = carried ] ||
    { run_step configure 60 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DENGINE_BUILD_TESTS=ON -DENGINE_BUILD_BENCH=ON -DCMAKE_PREFIX_PATH="$prefix" &&
        run_step build 240 cmake --build "$build" -j "$jobs"; }; then
    run_tests
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$sanitizer" ] && [ -x "$build/tests/engine_cuda_tests" ]; then
        run_step memcheck 120 "${runner[@]}" "$sanitizer" --tool memcheck --error-exitcode 1 \
            "$build/tests/engine_cuda_tests" --gtest_brief=1
    else
        status_lines+=("memcheck: skipped (no compute-sanitizer or no engine_cuda_tests)")
    fi
    for program in cuda/bench_kernels_cuda bench_train_step; do
        binary=$build/bench/$program
        name=$(basename "$program")
        if [ -x "$binary" ]; then
            run_step "$name" 90 "${runner[@]}" "$binary" --benchmark_min_time=0.1 --benchmark_out="$out/$name.json" \
                --benchmark_out_format=json
        else
            status_lines+=("$name: not built")
        fi
    done
    measure_offload
fi

echo "== gpu_check steps =="
printf '%s\n' "${status_lines[@]}"
grep -h -E "^\[  (FAILED|SKIPPED) |tests passed|ERROR SUMMARY" "$out"/ctest.log "$out"/tests_cpu.log \
    "$out"/tests_cuda.log "$out"/memcheck.log 2>/dev/null | head -30

# Throughput table against the H200 ceilings: 4.3 TB/s HBM, 67 TFLOP/s fp32, 495 TFLOP/s dense TF32.
echo "== throughput (H200 ceilings: 4.3 TB/s, fp32 67 TFLOP/s, tf32 495 TFLOP/s) =="
python3 - "$out" <<'PYTHON' || echo "(python3 unavailable: see $out/*.json)"
import glob, json, sys
print(f"{'kernel':40s} {'time':>12s} {'throughput':>16s} {'of ceiling':>10s}")
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
        if "FLOPS" in entry:
            ceiling = 495e12 if entry.get("label") == "tf32" else 67e12
            print(f"{name:40s} {time:>12s} {entry['FLOPS'] / 1e12:11.1f} TFLOP/s {100 * entry['FLOPS'] / ceiling:9.1f}%")
        elif "bytes_per_second" in entry:
            rate = entry["bytes_per_second"]
            print(f"{name:40s} {time:>12s} {rate / 1e9:12.0f} GB/s {100 * rate / 4.3e12:9.1f}%")
        else:
            print(f"{name:40s} {time:>12s}")
# train_gpt JSON lines: the first two steps warm the caches and are left out of the mean.
for path in sorted(glob.glob(sys.argv[1] + "/offload_*.jsonl")):
    try:
        steps = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        continue
    name = "train_gpt 124M B4 T1024 " + path.rsplit("/", 1)[1][len("offload_"):-len(".jsonl")]
    steady = steps[2:] or steps
    if not steady:
        print(f"{name:40s} {'no steps logged':>40s}")
        continue
    rate = sum(step["tokens_per_second"] for step in steady) / len(steady)
    peak = max(step["peak_total_mib"] for step in steady)
    print(f"{name:40s} {rate:12.0f} tok/s {peak:10.0f} MiB peak")
PYTHON
