// The multi-tensor AdamW update with the step's epilogue (engine::adamw_update over ranges), held to the bit to
// what it replaces: the per-range update, convert_into and a zero fill. Shared by the CPU test (test_optim.cpp)
// and the device's (tests/cuda/test_pointwise_kernels.cpp), so both devices pass the same cases.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/ops.h"
#include "engine/optimizer_updates.h"
#include "gradcheck.h"

namespace engine::testing {

// The elements of a floating tensor as doubles and of a bf16 one as their bits: exact comparisons for either.
inline std::vector<double> values_of(const Tensor& tensor) {
    const Tensor host = tensor.to(Device::cpu);
    if (host.dtype() == DType::f64) return host.to_vector<double>();
    if (host.dtype() == DType::f32) {
        const std::vector<float> narrow = host.to_vector<float>();
        return {narrow.begin(), narrow.end()};
    }
    std::vector<double> bits;
    for (const bfloat16 value : host.to_vector<bfloat16>()) bits.push_back(value.bits);
    return bits;
}

// A tensor of `dtype` on `device` holding `values` (rounded once to f32 for an f32 tensor).
inline Tensor tensor_of(const std::vector<double>& values, DType dtype, Device device) {
    const Tensor host = Tensor::from_vector<double>(values, {int64_t(values.size())}, Device::cpu);
    return (dtype == DType::f64 ? host : cast(host, dtype)).to(device);
}

// Ranges at the start of or inside larger tensors, of sizes around the CUDA kernel's 4096-float tile and its packs of 4,
// some with no elements; 140 of them, 124 holding elements (two launches of 64 on CUDA: the second list's tiles count
// from 0 again), every other one with a working copy, decaying or not; one update, compared element by element with
// the reference.
inline void expect_adamw_list_matches_per_range_updates(Device device, DType dtype, std::mt19937_64& generator) {
    const std::vector<int64_t> sizes = {1, 3, 4, 4097, 0, 8192, 130, 5, 16385};
    struct Case {
        int64_t count, first, gradient_first;
        bool decays, copied;
    };
    std::vector<Case> cases;
    // Even ranges start their tensors (CUDA's 128-bit path), odd ones 1 to 3 elements in (its scalar path).
    for (int index = 0; index < 140; ++index)
        cases.push_back({sizes[index % sizes.size()], index % 2 == 0 ? 0 : 1 + index % 3, index % 2 == 0 ? 0 : 1,
                         index % 3 == 0, index % 4 < 2});
    const AdamWUpdate update{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f, 0.142625f, 0.5f};
    // Two identical sets: one for the list, one for the reference.
    struct Set {
        std::vector<Tensor> parameters, gradients, first_moments, second_moments, copies;
    } listed, reference;
    std::normal_distribution<double> normal(0.0, 1.0);
    const auto random_values = [&](int64_t count, double scale, bool square) {
        std::vector<double> values(static_cast<size_t>(count));
        for (double& value : values) value = square ? scale * std::pow(normal(generator), 2) : scale * normal(generator);
        return values;
    };
    for (const Case& c : cases) {
        const std::vector<double> parameter = random_values(c.first + c.count + 2, 1.0, false),
                                  gradient = random_values(c.gradient_first + c.count + 1, 1.0, false),
                                  first_moment = random_values(c.count, 0.1, false),
                                  second_moment = random_values(c.count, 0.01, true); // >= 0, as a second moment is
        for (Set* set : {&listed, &reference}) {
            set->parameters.push_back(tensor_of(parameter, dtype, device));
            set->gradients.push_back(tensor_of(gradient, dtype, device));
            set->first_moments.push_back(tensor_of(first_moment, dtype, device));
            set->second_moments.push_back(tensor_of(second_moment, dtype, device));
            set->copies.push_back(Tensor::zeros({c.first + c.count + 2}, DType::bf16, device));
        }
    }
    std::vector<AdamWRange> ranges;
    for (size_t index = 0; index < cases.size(); ++index) {
        const Case& c = cases[index];
        ranges.push_back({listed.parameters[index], c.first, listed.gradients[index], c.gradient_first,
                          listed.first_moments[index], listed.second_moments[index], c.count, c.decays,
                          c.copied ? listed.copies[index] : Tensor()});
        AdamWUpdate own = update;
        own.weight_decay = c.decays ? update.weight_decay : 0.0f;
        adamw_update(reference.parameters[index], reference.gradients[index], c.gradient_first,
                     reference.first_moments[index], reference.second_moments[index], c.first, c.count, own);
        if (c.copied) convert_into(reference.copies[index], reference.parameters[index]);
        // The fill the list replaces: the range's gradient elements only.
        std::vector<double> gradient = values_of(reference.gradients[index]);
        for (int64_t element = 0; element < c.count; ++element) gradient[c.gradient_first + element] = 0.0;
        reference.gradients[index].copy_from(tensor_of(gradient, dtype, device));
    }
    adamw_update(ranges, update, /*zero_gradients=*/true);
    for (size_t index = 0; index < cases.size(); ++index) {
        const Case& c = cases[index];
        const std::string where = "range " + std::to_string(index) + " of " + std::to_string(c.count) + " elements";
        EXPECT_EQ(values_of(listed.parameters[index]), values_of(reference.parameters[index])) << where;
        EXPECT_EQ(values_of(listed.first_moments[index]), values_of(reference.first_moments[index])) << where;
        EXPECT_EQ(values_of(listed.second_moments[index]), values_of(reference.second_moments[index])) << where;
        EXPECT_EQ(values_of(listed.gradients[index]), values_of(reference.gradients[index])) << where;
        // The copy holds the range's elements rounded, and nothing outside it.
        std::vector<double> expected = values_of(reference.copies[index]);
        for (size_t element = 0; element < expected.size(); ++element)
            if (!c.copied || int64_t(element) < c.first || int64_t(element) >= c.first + c.count) expected[element] = 0.0;
        EXPECT_EQ(values_of(listed.copies[index]), expected) << where;
    }
}

} // namespace engine::testing
