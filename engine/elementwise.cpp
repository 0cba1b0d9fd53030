// In-place helpers over the elementwise and reduction kernels of both devices.
#include "engine/elementwise.h"

#include <algorithm>
#include <cmath>

#include "engine/dispatch.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

void accumulate_into(const Tensor& destination, const Tensor& source, double alpha) {
    check_same_device("accumulate", destination, source);
    ENGINE_CHECK(destination.numel() == source.numel(),
                 "accumulate: " << destination.describe() << " += " << source.describe() << ": sizes differ");
    if (destination.dtype() == DType::bf16 || source.dtype() == DType::bf16) {
        // bf16 on either side (a bf16 gradient into an f32 buffer, or back, or bf16 into bf16): float
        // arithmetic with one rounding on store.
        ENGINE_CHECK((destination.dtype() == DType::f32 || destination.dtype() == DType::bf16) &&
                         (source.dtype() == DType::f32 || source.dtype() == DType::bf16),
                     "accumulate: dtype mismatch between " << destination.describe() << " and " << source.describe());
        auto mixed = [&]<typename Destination, typename Source>() {
            if (destination.device() == Device::cpu) {
                kernels::cpu::axpy<Destination, Source>(destination.data<Destination>(), source.data<Source>(),
                                                        static_cast<float>(alpha), destination.numel());
            } else {
                ENGINE_CUDA_ONLY("accumulate", kernels::cuda::axpy<Destination, Source>(
                                                   destination.data<Destination>(), source.data<Source>(),
                                                   static_cast<float>(alpha), destination.numel(), cuda::compute_stream()));
            }
        };
        if (destination.dtype() == DType::f32) mixed.template operator()<float, bfloat16>();
        else if (source.dtype() == DType::f32) mixed.template operator()<bfloat16, float>();
        else mixed.template operator()<bfloat16, bfloat16>();
        return;
    }
    check_same_dtype("accumulate", destination, source);
    if (destination.device() == Device::cpu) {
        dispatch_floating("accumulate", destination.dtype(), [&]<typename T>() {
            kernels::cpu::axpy<T>(destination.data<T>(), source.data<T>(), static_cast<T>(alpha), destination.numel());
        });
    } else {
        ENGINE_ON_CUDA("accumulate", destination.dtype(),
                       kernels::cuda::axpy(destination.data<float>(), source.data<float>(), static_cast<float>(alpha),
                                           destination.numel(), cuda::compute_stream()));
    }
}

void scale_in_place(const Tensor& tensor, double factor) {
    if (tensor.device() == Device::cpu) {
        dispatch_floating("scale", tensor.dtype(), [&]<typename T>() {
            kernels::cpu::scale<T>(tensor.data<T>(), static_cast<T>(factor), tensor.numel());
        });
    } else {
        ENGINE_ON_CUDA("scale", tensor.dtype(),
                       kernels::cuda::scale(tensor.data<float>(), static_cast<float>(factor), tensor.numel(),
                                            cuda::compute_stream()));
    }
}

double sum_of_squares(const Tensor& tensor) {
    double result = 0.0;
    if (tensor.device() == Device::cpu) {
        dispatch_floating("sum_of_squares", tensor.dtype(), [&]<typename T>() {
            kernels::cpu::sum_of_squares<T>(&result, tensor.data<T>(), tensor.numel());
        });
    } else {
        ENGINE_ON_CUDA("sum_of_squares", tensor.dtype(), {
            Tensor device_result = Tensor::zeros({1}, DType::f64, Device::cuda, MemoryCategory::workspace);
            const int64_t count = tensor.numel();
            const cuda::Scratch<double> partials(
                static_cast<size_t>(kernels::cuda::sum_of_squares_workspace_count(&count, 1)), cuda::compute_stream());
            kernels::cuda::sum_of_squares(device_result.data<double>(), partials.get(), tensor.data<float>(),
                                          tensor.numel(), cuda::compute_stream());
            result = device_result.to_vector<double>()[0];
        });
    }
    return result;
}

double sum_of_squares(const std::vector<Tensor>& tensors) {
    if (tensors.empty()) return 0.0;
    std::vector<const void*> data;
    std::vector<int64_t> counts;
    for (const Tensor& tensor : tensors) {
        check_same_device("sum_of_squares", tensors.front(), tensor);
        check_same_dtype("sum_of_squares", tensors.front(), tensor);
        data.push_back(tensor.raw_data());
        counts.push_back(tensor.numel());
    }
    const int count = static_cast<int>(tensors.size());
    double result = 0.0;
    if (tensors.front().device() == Device::cpu) {
        dispatch_floating("sum_of_squares", tensors.front().dtype(), [&]<typename T>() {
            std::vector<const T*> typed(data.size());
            for (size_t index = 0; index < data.size(); ++index) typed[index] = static_cast<const T*>(data[index]);
            kernels::cpu::sum_of_squares_list<T>(&result, typed.data(), counts.data(), count);
        });
    } else {
        ENGINE_ON_CUDA("sum_of_squares", tensors.front().dtype(), {
            std::vector<const float*> typed(data.size());
            for (size_t index = 0; index < data.size(); ++index) typed[index] = static_cast<const float*>(data[index]);
            const cuda::Scratch<double> result_and_partials(
                1 + static_cast<size_t>(kernels::cuda::sum_of_squares_workspace_count(counts.data(), count)),
                cuda::compute_stream());
            kernels::cuda::sum_of_squares_list(result_and_partials.get(), result_and_partials.get() + 1, typed.data(),
                                               counts.data(), count, cuda::compute_stream());
            copy_bytes(&result, Device::cpu, result_and_partials.get(), Device::cuda, sizeof result); // the one read
        });
    }
    return result;
}

bool all_finite(const Tensor& tensor) { return std::isfinite(sum_of_squares(tensor)); }

} // namespace engine
