// One helper for bad-input tests: the call must throw EngineError whose message names every given part.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"

namespace engine::testing {

template <typename Function>
void expect_error(Function&& function, const std::vector<std::string>& parts) {
    try {
        function();
        ADD_FAILURE() << "expected an EngineError";
    } catch (const EngineError& error) {
        const std::string message = error.what();
        for (const std::string& part : parts)
            EXPECT_NE(message.find(part), std::string::npos) << message << "\nlacks: " << part;
    }
}

} // namespace engine::testing
