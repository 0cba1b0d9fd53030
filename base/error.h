// The engine's one error type and its checking macros. Library code throws; it never exits or aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace engine {

class EngineError : public std::runtime_error {
public:
    explicit EngineError(const std::string& message) : std::runtime_error(message) {}
};

// Raised when an allocation cannot be satisfied; the message carries the request and current usage.
class OutOfMemoryError : public EngineError {
public:
    explicit OutOfMemoryError(const std::string& message) : EngineError(message) {}
};

// A bad field of a configuration struct (TrainerConfig, GPTConfig): the field's name, as the struct spells it,
// and why. Each config has one `problem()` holding its rules; validate() throws it, and the CLI maps the field
// to its flag, so no rule is written twice.
struct ConfigProblem {
    std::string field;
    std::string reason;
};

// A value as an error message streams it ("1.5", "1e-08", "nan"), for reasons built as strings.
template <typename Value>
std::string value_text(const Value& value) {
    std::ostringstream text;
    text << value;
    return text.str();
}

[[noreturn]] inline void throw_error(const char* file, int line, const std::string& message) {
    std::ostringstream text;
    text << message << " (" << file << ":" << line << ")";
    throw EngineError(text.str());
}

} // namespace engine

// ENGINE_CHECK(condition, streamed message): e.g. ENGINE_CHECK(a == b, "linear: " << shape_a << " vs " << shape_b)
#define ENGINE_CHECK(condition, message)                                                                 \
    do {                                                                                                 \
        if (!(condition)) {                                                                              \
            std::ostringstream engine_check_text;                                                        \
            engine_check_text << message;                                                                \
            ::engine::throw_error(__FILE__, __LINE__, engine_check_text.str());                          \
        }                                                                                                \
    } while (0)

#define ENGINE_FAIL(message) ENGINE_CHECK(false, message)
