// The op profiler's table: per (phase, op) call counts and wall time, accumulated under one mutex only while
// profiling is on, and the report train_gpt --profile prints.
#include "engine/profiling.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <utility>

namespace engine::profiling {
namespace {

struct Totals {
    int64_t calls = 0;
    int64_t nanoseconds = 0;
};

// Kernel calls are microseconds to seconds long, so one uncontended lock per recorded call is noise; keeping
// one table (not one per thread) lets snapshot() and reset() be exact without stopping the other threads.
struct Table {
    std::mutex mutex;
    std::array<std::map<std::string, Totals, std::less<>>, phase_count> by_phase;
};

Table& table() {
    static Table instance;
    return instance;
}

thread_local Phase thread_phase = Phase::forward;
thread_local int thread_depth = 0; // open regions on this thread

int64_t now_nanoseconds() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// ENGINE_PROFILE=1 (any value but empty or "0") turns the profiler on before main, for programs without a flag.
const bool enabled_from_environment = [] {
    const char* value = std::getenv("ENGINE_PROFILE");
    const bool on = value != nullptr && *value != '\0' && std::string_view(value) != "0";
    if (on) detail::enabled_flag.store(true, std::memory_order_relaxed);
    return on;
}();

} // namespace

const char* phase_name(Phase phase) {
    switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::grad_norm: return "grad_norm";
    case Phase::optimizer: return "optimizer";
    }
    return "?";
}

void set_enabled(bool enabled) { detail::enabled_flag.store(enabled, std::memory_order_relaxed); }

Phase current_phase() { return thread_phase; }

PhaseScope::PhaseScope(Phase phase) : previous_(thread_phase) { thread_phase = phase; }
PhaseScope::~PhaseScope() { thread_phase = previous_; }

Region::Region(const char* op) : op_(op), outermost_(thread_depth == 0) {
    ++thread_depth;
    if (outermost_) start_nanoseconds_ = now_nanoseconds();
}

Region::~Region() {
    --thread_depth;
    if (!outermost_) return;
    const int64_t elapsed = now_nanoseconds() - start_nanoseconds_;
    Table& shared = table();
    const std::lock_guard<std::mutex> lock(shared.mutex);
    auto& ops = shared.by_phase[static_cast<size_t>(thread_phase)];
    auto found = ops.find(std::string_view(op_));
    if (found == ops.end()) found = ops.emplace(op_, Totals{}).first;
    found->second.calls += 1;
    found->second.nanoseconds += elapsed;
}

std::string category_of(std::string_view op, Phase phase) {
    if (phase == Phase::grad_norm || phase == Phase::optimizer) return "optimizer";
    static const std::map<std::string_view, std::string_view, std::less<>> categories = {
        {"linear", "gemm"},          {"matmul", "gemm"},           {"batched_matmul", "gemm"},
        {"gemm", "gemm"},            {"attention", "attention"},   {"attention_decode", "attention"},
        {"layernorm", "normalisation"}, {"rms_norm", "normalisation"}, {"softmax", "normalisation"},
        {"log_softmax", "normalisation"}, {"cross_entropy", "loss"}, {"cross_entropy_in_place", "loss"},
        {"linear_cross_entropy", "loss"}, {"linear_cross_entropy_gemm", "gemm"},
        {"mse_loss", "loss"},        {"embedding", "embedding"},   {"embedding_at", "embedding"},
        {"gelu", "elementwise"},     {"swiglu", "elementwise"},    {"dropout", "elementwise"},
        {"rope", "elementwise"},     {"linear_bias", "elementwise"}, {"add", "elementwise"},
        {"sub", "elementwise"},      {"mul", "elementwise"},       {"div", "elementwise"},
        {"relu", "elementwise"},     {"silu", "elementwise"},      {"tanh", "elementwise"},
        {"sigmoid", "elementwise"},  {"exp", "elementwise"},       {"log", "elementwise"},
        {"accumulate", "elementwise"}, {"scale", "elementwise"},   {"fill", "elementwise"},
        {"zero", "elementwise"},     {"copy", "elementwise"},      {"cast", "elementwise"},
        {"sum", "elementwise"},      {"mean", "elementwise"},      {"max", "elementwise"},
        {"sum_of_squares", "elementwise"}, {"permute", "layout"},  {"transpose", "layout"},
        {"slice", "layout"},         {"concat", "layout"},         {"first_columns", "layout"},
    };
    const auto found = categories.find(op);
    return std::string(found == categories.end() ? std::string_view("other") : found->second);
}

double Snapshot::seconds_in_category(std::string_view category) const {
    double seconds = 0.0;
    for (const OpRecord& record : records)
        if (record.category == category) seconds += record.seconds;
    return seconds;
}

int64_t Snapshot::calls_of(std::string_view op, Phase phase) const {
    for (const OpRecord& record : records)
        if (record.op == op && record.phase == phase) return record.calls;
    return 0;
}

Snapshot snapshot() {
    Snapshot result;
    {
        Table& shared = table();
        const std::lock_guard<std::mutex> lock(shared.mutex);
        for (int phase = 0; phase < phase_count; ++phase)
            for (const auto& [op, totals] : shared.by_phase[static_cast<size_t>(phase)]) {
                OpRecord record;
                record.op = op;
                record.phase = static_cast<Phase>(phase);
                record.calls = totals.calls;
                record.seconds = static_cast<double>(totals.nanoseconds) * 1e-9;
                result.records.push_back(std::move(record));
            }
    }
    for (OpRecord& record : result.records) {
        record.category = category_of(record.op, record.phase);
        result.total_seconds += record.seconds;
        result.total_calls += record.calls;
    }
    std::stable_sort(result.records.begin(), result.records.end(),
                     [](const OpRecord& a, const OpRecord& b) { return a.seconds > b.seconds; });
    return result;
}

void reset() {
    Table& shared = table();
    const std::lock_guard<std::mutex> lock(shared.mutex);
    for (auto& ops : shared.by_phase) ops.clear();
}

std::string format_report(const Snapshot& snapshot, double step_seconds) {
    std::ostringstream text;
    char line[256];
    const double total = snapshot.total_seconds;
    auto percent = [](double part, double whole) { return whole > 0.0 ? 100.0 * part / whole : 0.0; };
    std::snprintf(line, sizeof line, "%-24s %-10s %8s %12s %8s  %s\n", "op", "phase", "calls", "total ms", "% prof",
                  "category");
    text << line;
    for (const OpRecord& record : snapshot.records) {
        std::snprintf(line, sizeof line, "%-24s %-10s %8lld %12.1f %7.1f%%  %s\n", record.op.c_str(),
                      phase_name(record.phase), static_cast<long long>(record.calls), record.seconds * 1e3,
                      percent(record.seconds, total), record.category.c_str());
        text << line;
    }
    std::snprintf(line, sizeof line, "%-24s %-10s %8lld %12.1f %7.1f%%\n", "profiled total", "", 
                  static_cast<long long>(snapshot.total_calls), total * 1e3, total > 0.0 ? 100.0 : 0.0);
    text << line;

    // Per category: the share of the profiled time, and of the steps' wall time when it is known.
    std::map<std::string, double> by_category;
    for (const OpRecord& record : snapshot.records) by_category[record.category] += record.seconds;
    std::vector<std::pair<std::string, double>> categories(by_category.begin(), by_category.end());
    std::stable_sort(categories.begin(), categories.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    text << "by category:";
    for (const auto& [category, seconds] : categories) {
        if (step_seconds > 0.0)
            std::snprintf(line, sizeof line, " %s %.1f%% (%.1f%% of step)", category.c_str(), percent(seconds, total),
                          percent(seconds, step_seconds));
        else
            std::snprintf(line, sizeof line, " %s %.1f%%", category.c_str(), percent(seconds, total));
        text << line << (&category == &categories.back().first ? "" : ",");
    }
    text << "\n";
    if (step_seconds > 0.0) {
        const double unprofiled = step_seconds - total;
        std::snprintf(line, sizeof line,
                      "step wall time %.1f ms = profiled %.1f ms + unprofiled %.1f ms (%.1f%%: allocation, the tape, "
                      "data, untimed code)\n",
                      step_seconds * 1e3, total * 1e3, unprofiled * 1e3, percent(unprofiled, step_seconds));
        text << line;
        std::snprintf(line, sizeof line, "GEMM share: %.1f%% of the step wall time, %.1f%% of the profiled time\n",
                      percent(snapshot.seconds_in_category("gemm"), step_seconds),
                      percent(snapshot.seconds_in_category("gemm"), total));
        text << line;
    } else {
        std::snprintf(line, sizeof line, "GEMM share: %.1f%% of the profiled time\n",
                      percent(snapshot.seconds_in_category("gemm"), total));
        text << line;
    }
    return text.str();
}

} // namespace engine::profiling
