// The one tolerance check for CUDA-vs-CPU tests: |actual - expected| <= atol + rtol * |expected| on every
// element, never on a mean. On failure it reports the max absolute and relative errors and the first
// mismatches with their indices; NaN anywhere (e.g. an unwritten, poisoned element) is a mismatch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace engine::test {

struct Tolerance {
    double atol = 1e-5;
    double rtol = 1e-4;
};

template <typename Actual, typename Expected>
::testing::AssertionResult all_close(const std::vector<Actual>& actual, const std::vector<Expected>& expected,
                                     Tolerance tolerance, const std::string& what) {
    if (actual.size() != expected.size()) {
        return ::testing::AssertionFailure()
               << what << ": sizes differ, " << actual.size() << " vs " << expected.size();
    }
    constexpr int mismatches_shown = 8;
    double max_absolute = 0.0, max_relative = 0.0;
    size_t mismatch_count = 0;
    std::ostringstream first;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double a = static_cast<double>(actual[i]), e = static_cast<double>(expected[i]);
        const double absolute = std::fabs(a - e);
        const double relative = absolute / std::max(std::fabs(e), 1e-30);
        bool ok;
        if (std::isnan(a) || std::isnan(e)) {
            ok = false; // a poisoned element that was never written, or a real NaN: both are failures
        } else if (std::isinf(a) || std::isinf(e)) {
            ok = a == e;
        } else {
            ok = absolute <= tolerance.atol + tolerance.rtol * std::fabs(e);
            max_absolute = std::max(max_absolute, absolute);
            if (std::fabs(e) > tolerance.atol) max_relative = std::max(max_relative, relative);
        }
        if (!ok) {
            if (mismatch_count < mismatches_shown) {
                first << "\n  [" << i << "] cuda " << a << " cpu " << e << " |diff| " << absolute;
            }
            ++mismatch_count;
        }
    }
    std::ostringstream summary;
    summary << what << ": " << actual.size() << " elements, max abs error " << max_absolute
            << ", max rel error " << max_relative << " (atol " << tolerance.atol << ", rtol " << tolerance.rtol
            << ")";
    if (mismatch_count == 0) return ::testing::AssertionSuccess() << summary.str();
    return ::testing::AssertionFailure() << summary.str() << ", " << mismatch_count
                                         << " mismatches; first:" << first.str();
}

} // namespace engine::test
