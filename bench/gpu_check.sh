#!/usr/bin/env bash
# One-shot check on a lent GPU machine (no network): builds GoogleTest, Google Benchmark (and nlohmann_json
# when carried) from third_party_src/, builds libengine with CUDA for sm_90, runs ctest, compute-sanitizer
# memcheck over the CUDA tests, the kernel and train-step benchmarks, and prints a throughput table last.
# Whole run bounded by an 8-minute budget; logs go to $OUT (or /tmp/gpu_check).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_check}
work=/tmp/gpu_check_work
prefix=$work/prefix
build=$work/build
third=$root/third_party_src
jobs=$(nproc)
mkdir -p "$out" "$work"
deadline=$((SECONDS + ${GPU_CHECK_BUDGET_S:-480}))
status_lines=()

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

install_source googletest "$third/googletest" -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON
install_source benchmark "$third/benchmark" -DBENCHMARK_ENABLE_TESTING=OFF -DBENCHMARK_ENABLE_GTEST_TESTS=OFF \
    -DBENCHMARK_ENABLE_INSTALL=ON -DBENCHMARK_DOWNLOAD_DEPENDENCIES=OFF -DBENCHMARK_ENABLE_WERROR=OFF
install_source json "$third/json" -DJSON_BuildTests=OFF -DJSON_Install=ON

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1

if run_step configure 60 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DENGINE_BUILD_TESTS=ON -DENGINE_BUILD_BENCH=ON -DCMAKE_PREFIX_PATH="$prefix" &&
    run_step build 240 cmake --build "$build" -j "$jobs"; then
    run_step ctest 120 ctest --test-dir "$build" --output-on-failure -j 4
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$sanitizer" ] && [ -x "$build/tests/engine_cuda_tests" ]; then
        run_step memcheck 120 "$sanitizer" --tool memcheck --error-exitcode 1 "$build/tests/engine_cuda_tests"
    else
        status_lines+=("memcheck: skipped (no compute-sanitizer or no engine_cuda_tests)")
    fi
    for program in cuda/bench_kernels_cuda bench_train_step; do
        binary=$build/bench/$program
        name=$(basename "$program")
        if [ -x "$binary" ]; then
            run_step "$name" 90 "$binary" --benchmark_min_time=0.1 --benchmark_out="$out/$name.json" \
                --benchmark_out_format=json
        else
            status_lines+=("$name: not built")
        fi
    done
fi

echo "== gpu_check steps =="
printf '%s\n' "${status_lines[@]}"
grep -h -E "^\[  (FAILED|SKIPPED) |tests passed|ERROR SUMMARY" "$out"/ctest.log "$out"/memcheck.log 2>/dev/null | head -30

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
PYTHON
