// Sums of many f64 terms in eight independent chains, for the CPU kernels' row and whole-tensor reductions: one
// chain waits 4 cycles on each add; eight chains let the compiler keep them in vector registers. The association
// (chain i takes terms i, i+8, ...; then the eight chains in order) depends only on the count, so it is the same
// on every thread and every machine.
#pragma once

#include <cstdint>

namespace engine::kernels::cpu {

inline constexpr int sum_lanes = 8;

// sum over i in [0, count) of term(i), term returning double.
template <typename Term>
double lane_sum(int64_t count, Term&& term) {
    double lanes[sum_lanes] = {};
    int64_t i = 0;
    for (; i + sum_lanes <= count; i += sum_lanes) {
        for (int lane = 0; lane < sum_lanes; ++lane) lanes[lane] += term(i + lane);
    }
    for (int lane = 0; i < count; ++i, ++lane) lanes[lane] += term(i);
    double sum = 0.0;
    for (const double lane : lanes) sum += lane;
    return sum;
}

} // namespace engine::kernels::cpu
