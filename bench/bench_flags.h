// The --name=value flags the benchmark programs take before handing the rest to Google Benchmark.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

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

// Splits argv: each `--name=value` whose name `setters` holds goes to its setter (which exits 2 on a bad value);
// argv[0] and every other argument are returned, for Google Benchmark.
inline std::vector<char*> split_flags(int argc, char** argv,
                                      const std::map<std::string, std::function<void(const char*)>>& setters) {
    std::vector<char*> remaining{argv[0]};
    for (int index = 1; index < argc; ++index) {
        bool taken = false;
        for (const auto& [name, set] : setters)
            if (const char* text = flag_value(argv[index], name.c_str())) {
                set(text);
                taken = true;
                break;
            }
        if (!taken) remaining.push_back(argv[index]);
    }
    return remaining;
}

// Google Benchmark over the arguments split_flags left: false (exit 2) when one of them is not its flag either.
inline bool start_benchmark(std::vector<char*>& remaining) {
    int count = static_cast<int>(remaining.size());
    benchmark::Initialize(&count, remaining.data());
    return !benchmark::ReportUnrecognizedArguments(count, remaining.data());
}

} // namespace bench
