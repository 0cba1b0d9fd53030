#!/usr/bin/env bash
# Prepares the carried-binaries mode of bench/gpu_check.sh. The lent GPU machine has CUDA 13, cmake and
# ninja but no network and none of GoogleTest, Google Benchmark, OpenBLAS or nlohmann_json, so here we build
# the tests, benchmarks and train_gpt with CUDA for sm_90, strip them, and gather them with every shared
# library they load that is neither glibc nor the CUDA toolkit into gpu_carry/ (ignored by git):
#   gpu_carry/build/{tests,bench,bench/cuda}/...  the binaries, in the build tree's layout
#   gpu_carry/lib/                                 libopenblas, libgfortran, libquadmath, libstdc++, ...
#   gpu_carry/MANIFEST                             source root, commit, file sizes
# The object tree stays in build_gpu_carry/ (ignored) for incremental rebuilds; only gpu_carry/ travels:
#   run(command="bash bench/gpu_check.sh", carry=["gpu_carry"], timeout_s=540)     (docs/CUDA.md)
# Usage: scripts/prepare_gpu_carry.sh   (JOBS=N for the build's parallelism; default 2)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
objects=${GPU_CARRY_OBJECTS:-$root/build_gpu_carry}
carry=$root/gpu_carry
limit_mib=60 # the device tool carries at most 64 MiB in all

cmake -S "$root" -B "$objects" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DENGINE_BUILD_TESTS=ON -DENGINE_BUILD_BENCH=ON >/dev/null
cmake --build "$objects" -j "${JOBS:-2}"

rm -rf "$carry"
mkdir -p "$carry/build" "$carry/lib"
binaries=()
while IFS= read -r binary; do
    relative=${binary#"$objects"/}
    mkdir -p "$carry/build/$(dirname "$relative")"
    cp "$binary" "$carry/build/$relative"
    strip --strip-unneeded "$carry/build/$relative"
    binaries+=("$carry/build/$relative")
done < <(find "$objects/tests" "$objects/bench" -path '*/CMakeFiles' -prune -o -type f -perm -u+x -print | sort)
for required in tests/engine_tests tests/engine_cuda_tests; do
    [ -x "$carry/build/$required" ] || { echo "prepare_gpu_carry: $required was not built" >&2; exit 1; }
done

# What the machine already has: glibc's own libraries and the CUDA toolkit's. Everything else is carried.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libmvec)\.so'
declare -A libraries=()
for binary in "${binaries[@]}"; do
    while read -r name arrow path rest; do
        [ "$arrow" = "=>" ] || continue
        if [ "$path" = "not" ]; then echo "prepare_gpu_carry: $binary needs $name, not found here" >&2; exit 1; fi
        [[ $name =~ $provided ]] && continue
        [[ $path == */cuda* ]] && continue
        libraries[$name]=$path
    done < <(ldd "$binary")
done
for name in "${!libraries[@]}"; do
    cp -L "${libraries[$name]}" "$carry/lib/$name"
    strip --strip-unneeded "$carry/lib/$name" 2>/dev/null || true
done

{
    echo "source_root $root"
    echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown) (plus uncommitted changes, if any)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(nvcc --version | tail -1)"
    (cd "$carry" && find build lib -type f -printf '%10s %p\n' | sort -k2)
} >"$carry/MANIFEST"
echo "$root" >"$carry/source_root" # tests read tests/data through this absolute path (gpu_check.sh links it)

total_kib=$(du -sk "$carry" | cut -f1)
echo "gpu_carry: $(find "$carry/build" -type f | wc -l) binaries, ${#libraries[@]} libraries ($(printf '%s ' "${!libraries[@]}")), $((total_kib / 1024)) MiB"
if ((total_kib > limit_mib * 1024)); then
    echo "prepare_gpu_carry: gpu_carry is $((total_kib / 1024)) MiB, over the ${limit_mib} MiB carry budget" >&2
    exit 1
fi
