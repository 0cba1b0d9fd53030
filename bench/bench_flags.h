// The --name=value flags the benchmark programs take before handing the rest to Google Benchmark.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bench {

// The value of `--name=value`, or null when `argument` is another flag.
inline const char* flag_value(const char* argument, const char* name) {
    const size_t length = std::strlen(name);
    if (std::strncmp(argument, name, length) != 0 || argument[length] != '=') return nullptr;
    return argument + length + 1;
}

// `text` as an integer in [1, 1e6]; anything else ends the program with exit 2 and one line naming the flag.
inline int positive_flag(const char* program, const char* name, const char* text) {
    char* end = nullptr;
    const long parsed = std::strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || parsed <= 0 || parsed > 1'000'000) {
        std::fprintf(stderr, "%s: %s needs a positive integer, got '%s'\n", program, name, text);
        std::exit(2);
    }
    return static_cast<int>(parsed);
}

} // namespace bench
