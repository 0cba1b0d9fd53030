#!/usr/bin/env bash
# Prepares the carried-binaries mode of bench/gpu_check.sh. The lent GPU machine has CUDA 13, cmake and
# ninja but no network and none of GoogleTest, Google Benchmark, a BLAS or nlohmann_json, so here we build
# the tests, benchmarks and train_gpt with CUDA for sm_90, strip the ones gpu_check runs (the CUDA test binaries,
# the kernel benchmarks, train_gpt, check_communicator when built: not the CPU tests, which CI runs), and gather
# them with every shared library they load that is neither glibc nor the CUDA toolkit into gpu_carry/ (ignored):
#   gpu_carry/build/{tests,bench,bench/cuda}/...  the binaries, in the build tree's layout
#   gpu_carry/lib/                                 libblas (netlib reference), libstdc++, libgcc_s, libz, ...
#   gpu_carry/headline_prediction.txt              bench/roofline.py's bf16 headline step, printed beside the measured
#   gpu_carry/MANIFEST                             source root, commit, BLAS, file sizes
# The carried build links the small netlib reference BLAS (Debian libblas-dev/libblas3, under 1 MiB), not
# OpenBLAS (about 36 MiB with libgfortran): the device tool carries at most 64 MiB, and CPU GEMM speed does
# not matter there (the CPU figures of a carried run are not representative; the CUDA ones are).
# libblas-dev is installed with apt-get when missing (as root).
# The object tree stays in build_gpu_carry/ (ignored) for incremental rebuilds; only gpu_carry/ travels:
#   run(command="bash bench/gpu_check.sh", carry=["gpu_carry"], timeout_s=540)     (docs/CUDA.md)
# Usage: scripts/prepare_gpu_carry.sh   (JOBS=N for the build's parallelism, default 2;
#                                        GPU_CARRY_LIMIT_MIB to change the 54 MiB size limit;
#                                        GPU_CARRY_MPI=AUTO to link MPI and NCCL, see below)
# MPI is left out by default (ENGINE_MPI=OFF, so no NCCL either): with it every binary would need the GPU
# machine's libnccl.so.2 (208 MiB, never carried, since it lies in the toolkit's directory here) and Open MPI's
# libraries, and that machine may have neither. gpu_check's NCCL step then notes that it was skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
objects=${GPU_CARRY_OBJECTS:-$root/build_gpu_carry}
carry=$root/gpu_carry
# The device tool moves at most 64 MiB: the repository's tracked files (about 6.4 MiB) and the carry together.
limit_mib=${GPU_CARRY_LIMIT_MIB:-54}

# The netlib reference BLAS, by its own path: /usr/lib/<multiarch>/libblas.so* are update-alternatives links
# that may point at OpenBLAS when that is installed too, so neither the link step nor ldd may go through them.
blas_status=$(dpkg-query -W -f='${Status}' libblas-dev 2>/dev/null || true)
if [[ $blas_status != *"install ok installed"* ]]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "prepare_gpu_carry: libblas-dev (netlib reference BLAS) is not installed; as root run" >&2
        echo "  apt-get update -qq && apt-get install -y -qq --no-install-recommends libblas-dev" >&2
        exit 1
    fi
    echo "prepare_gpu_carry: installing libblas-dev (netlib reference BLAS)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libblas-dev
fi
blas_files=$(dpkg-query -L libblas-dev)
blas_library=$(grep '/libblas\.so$' <<<"$blas_files" | head -1 || true) # e.g. /usr/lib/x86_64-linux-gnu/blas/libblas.so
blas_dir=$(dirname "${blas_library:-/nonexistent/x}")
if [ -z "$blas_library" ] || [ ! -e "$blas_library" ] || [ ! -e "$blas_dir/libblas.so.3" ]; then
    echo "prepare_gpu_carry: cannot find libblas-dev's libblas.so and libblas3's libblas.so.3 next to it" >&2
    exit 1
fi

# BLA_VENDOR=Generic makes FindBLAS look only for the reference "blas"; BLAS_blas_LIBRARY (its cache entry)
# pins it to the netlib file, also over a cache left by an earlier configure against OpenBLAS.
cmake -S "$root" -B "$objects" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON -DENGINE_MPI="${GPU_CARRY_MPI:-OFF}" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DENGINE_BUILD_TESTS=ON -DENGINE_BUILD_BENCH=ON \
    -DBLA_VENDOR=Generic -DBLAS_blas_LIBRARY="$blas_library" >/dev/null
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
done < <(for carried in tests/engine_cuda_tests tests/engine_cuda_trainer_tests tests/engine_cuda_no_device_tests \
    bench/cuda/bench_kernels_cuda bench/train_gpt bench/check_communicator; do
    [ -x "$objects/$carried" ] && echo "$objects/$carried"
done)
for required in tests/engine_cuda_tests tests/engine_cuda_trainer_tests bench/cuda/bench_kernels_cuda bench/train_gpt; do
    [ -x "$carry/build/$required" ] || { echo "prepare_gpu_carry: $required was not built" >&2; exit 1; }
done

# What the machine already has: glibc's own libraries and the CUDA toolkit's. Everything else is carried.
# ldd resolves libblas.so.3 in the netlib directory first (see above).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libmvec)\.so'
declare -A libraries=()
for binary in "${binaries[@]}"; do
    while read -r name arrow path rest; do
        [ "$arrow" = "=>" ] || continue
        if [ "$path" = "not" ]; then echo "prepare_gpu_carry: $binary needs $name, not found here" >&2; exit 1; fi
        [[ $name =~ $provided ]] && continue
        [[ $path == */cuda* ]] && continue
        libraries[$name]=$path
    done < <(LD_LIBRARY_PATH="$blas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$binary")
done
for name in "${!libraries[@]}"; do
    if [[ $name == libopenblas* || $name == libgfortran* ]]; then
        echo "prepare_gpu_carry: a binary still loads $name (${libraries[$name]}); expected the reference BLAS only" >&2
        exit 1
    fi
done
if [ -n "${libraries[libblas.so.3]:-}" ] &&
    [ "$(readlink -f "${libraries[libblas.so.3]}")" != "$(readlink -f "$blas_dir/libblas.so.3")" ]; then
    echo "prepare_gpu_carry: libblas.so.3 resolved to ${libraries[libblas.so.3]}, not the netlib $blas_dir" >&2
    exit 1
fi
for name in "${!libraries[@]}"; do
    cp -L "${libraries[$name]}" "$carry/lib/$name"
    strip --strip-unneeded "$carry/lib/$name" 2>/dev/null || true
done

{
    echo "source_root $root"
    echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown) (plus uncommitted changes, if any)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(nvcc --version | tail -1)"
    echo "blas netlib reference, libblas3 $(dpkg-query -W -f='${Version}' libblas3 2>/dev/null || echo '?')" \
        "(${libraries[libblas.so.3]:-statically linked or not loaded})"
    (cd "$carry" && find build lib -type f -printf '%10s %p\n' | sort -k2)
} >"$carry/MANIFEST"
echo "$root" >"$carry/source_root" # tests read tests/data through this absolute path (gpu_check.sh links it)
# The headline's prediction, so that gpu_check prints it beside the measured step without python3 there.
python3 "$root/bench/roofline.py" step --batch 16 --seq 1024 --math bf16 | tail -1 >"$carry/headline_prediction.txt"

total_kib=$(du -sk "$carry" | cut -f1)
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
echo "gpu_carry: $(find "$carry/build" -type f | wc -l) binaries ($(mib "$(du -sk "$carry/build" | cut -f1)") MiB)," \
    "${#libraries[@]} libraries ($(mib "$(du -sk "$carry/lib" | cut -f1)") MiB: $(printf '%s ' "${!libraries[@]}"))"
echo "gpu_carry: largest files:"
(cd "$carry" && find build lib -type f -printf '%s %p\n' | sort -rn | head -5 |
    awk '{ printf "  %7.1f MiB  %s\n", $1 / 1048576, $2 }')
tracked_kib=$(($(git -C "$root" ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) / 1024))
echo "gpu_carry: total $(mib "$total_kib") MiB (limit ${limit_mib} MiB); with the tracked files'" \
    "$(mib "$tracked_kib") MiB, $(mib $((total_kib + tracked_kib))) MiB of the device tool's 64 MiB"
if ((total_kib > limit_mib * 1024)); then
    echo "prepare_gpu_carry: gpu_carry is $(mib "$total_kib") MiB, over the ${limit_mib} MiB limit" >&2
    exit 1
fi
