// Kernel launches on the emulated CUDA device: ENGINE_LAUNCH (base/cuda/launch.h) lands here. A launch is
// checked like the real runtime checks it, then queued on its stream with its arguments bound; it runs
// when something forces the stream (emulator/streams.cpp). Its pointer arguments tell the emulator which
// allocations it reads (const T*) and writes (T*), for race detection and schedule replay; an argument that holds
// pointers (a tensor list) lists them through its for_each_pointer(visit) member.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// The bounds of the static __shared__ section of the module that launches (emulator/cuda_emulation.h).
extern "C" unsigned char __start_engine_emulated_shared[] __attribute__((weak, visibility("hidden")));
extern "C" unsigned char __stop_engine_emulated_shared[] __attribute__((weak, visibility("hidden")));

namespace engine::emulator {

struct PointerArgument {
    const void* pointer;
    bool writes; // a pointer to non-const: the kernel may write through it
    int position;
};

struct KernelLaunch {
    const char* name = "";
    const void* kernel = nullptr; // identifies the kernel for cudaFuncSetAttribute
    dim3 grid, block;
    size_t dynamic_shared_bytes = 0;
    cudaStream_t stream = nullptr;
    std::function<void()> run_thread; // the kernel body with this launch's arguments, for one thread
    std::vector<PointerArgument> pointers;
    unsigned char* static_shared_begin = nullptr;
    unsigned char* static_shared_end = nullptr;
};

// Validates and queues a launch; the result is also the thread's last error, as for a real launch.
cudaError_t submit_launch(KernelLaunch&& launch);
// The running block's dynamic shared memory, 16-byte aligned and poisoned before the block starts.
unsigned char* dynamic_shared_bytes();

template <typename T>
T* dynamic_shared_memory() {
    return reinterpret_cast<T*>(dynamic_shared_bytes());
}

template <typename Tuple, size_t... Index>
void collect_pointers(const Tuple& arguments, std::vector<PointerArgument>& pointers, std::index_sequence<Index...>) {
    auto collect = [&](const auto& argument, int position) {
        using Argument = std::decay_t<decltype(argument)>;
        if constexpr (std::is_pointer_v<Argument>) {
            using Pointee = std::remove_pointer_t<Argument>;
            pointers.push_back({static_cast<const void*>(argument), !std::is_const_v<Pointee>, position});
        } else if constexpr (requires { argument.for_each_pointer([](const void*) {}); }) {
            // A struct of pointers passed by value (a multi-tensor launch's list) names them itself: each is read
            // or written as a pointer argument would be, for the stream checks and the schedule replay.
            argument.for_each_pointer([&](auto* pointer) {
                using Pointee = std::remove_pointer_t<decltype(pointer)>;
                pointers.push_back({static_cast<const void*>(pointer), !std::is_const_v<Pointee>, position});
            });
        }
    };
    (collect(std::get<Index>(arguments), static_cast<int>(Index)), ...);
}

// Arguments convert to the kernel's parameter types here, as at a real launch.
template <typename... Parameters, typename... Arguments>
cudaError_t launch(const char* name, void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   cudaStream_t stream, Arguments&&... arguments) {
    static_assert(sizeof...(Parameters) == sizeof...(Arguments), "a kernel launch needs one argument per parameter");
    using Bound = std::tuple<std::remove_cv_t<Parameters>...>;
    auto bound = std::make_shared<const Bound>(std::forward<Arguments>(arguments)...);
    KernelLaunch launch;
    launch.name = name;
    launch.kernel = reinterpret_cast<const void*>(kernel);
    launch.grid = grid;
    launch.block = block;
    launch.dynamic_shared_bytes = dynamic_shared_bytes;
    launch.stream = stream;
    collect_pointers(*bound, launch.pointers, std::index_sequence_for<Parameters...>{});
    launch.run_thread = [kernel, bound] { std::apply(kernel, *bound); };
    launch.static_shared_begin = __start_engine_emulated_shared;
    launch.static_shared_end = __stop_engine_emulated_shared;
    return submit_launch(std::move(launch));
}

} // namespace engine::emulator
