#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang++ with ASan + UBSan) in build-fuzz/ and runs each for a bounded
# time on a copy of its seed corpus. Exits non-zero when any target finds a crash, leak or UB.
#   FUZZ_SECONDS  seconds per target (default 60)
#   FUZZ_TARGETS  space-separated subset of: state_file safetensors token_shard
#   FUZZ_BUILD_DIR  build directory (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"state_file safetensors token_shard"}
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}

compiler=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$compiler" ] || ! dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed"; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "fuzz: needs clang++ and libclang-rt-14-dev (libFuzzer); install them or run as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null
  compiler=$(command -v clang++ || command -v clang++-14)
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$compiler" \
  -DENGINE_CUDA=OFF -DENGINE_BUILD_TESTS=OFF -DENGINE_BUILD_BENCH=OFF -DENGINE_FUZZ=ON >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target $(printf 'fuzz_%s ' $targets)

work=$(mktemp -d)
# The path-based readers get each input through a file: keep it in memory when /dev/shm allows.
scratch=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$work" "$scratch"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
failed=()
for target in $targets; do
  corpus="$work/corpus-$target"
  mkdir -p "$corpus" "$work/artifacts-$target"
  cp fuzz/corpus/"$target"/* "$corpus"/
  echo "fuzz: $target for ${seconds}s"
  # -rss_limit_mb: a reader that allocates what a lying header asks for is a finding, not an OOM kill.
  if ! TMPDIR="$scratch" "$build_dir/fuzz/fuzz_$target" "$corpus" -max_total_time="$seconds" -rss_limit_mb=2048 \
      -max_len=65536 -timeout=10 -print_final_stats=1 -artifact_prefix="$work/artifacts-$target/" \
      >"$work/$target.log" 2>&1; then
    tail -n 60 "$work/$target.log" >&2
    mkdir -p "$build_dir/findings/$target"
    cp "$work/artifacts-$target"/* "$build_dir/findings/$target/" 2>/dev/null || true
    echo "fuzz: $target FAILED; crashing inputs kept in $build_dir/findings/$target (add them to fuzz/corpus/$target as regression-*)" >&2
    failed+=("$target")
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$work/$target.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no findings"
