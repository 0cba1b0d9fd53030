// Streams and events of the emulated device. Work is deferred: an operation queued on a stream runs only
// when something forces it (a later operation's stream order, an event wait, a synchronize, a blocking
// copy), so a missing cudaStreamWaitEvent reads stale data here instead of racing luckily. Every
// operation also carries a vector clock; an access to an allocation that no stream order, event or host
// synchronization orders after a conflicting access from another stream is reported as a race when it is
// queued, whether or not the deferred execution would have shown it.
#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "emulator/device.h"

namespace engine::emulator {
namespace {

struct Streams {
    std::vector<std::unique_ptr<StreamState>> all; // by id; never freed, since clocks and waits refer to them
    std::set<StreamState*> live;
    std::set<EventState*> events;
    Clock host; // what the host has waited for
};

Streams& streams() {
    static Streams* instance = [] {
        auto* created = new Streams();
        auto legacy = std::make_unique<StreamState>();
        legacy->id = 0;
        legacy->legacy = true;
        created->live.insert(legacy.get());
        created->all.push_back(std::move(legacy));
        return created;
    }();
    return *instance;
}

void join(Clock& into, const Clock& other) {
    if (into.size() < other.size()) into.resize(other.size(), 0);
    for (size_t index = 0; index < other.size(); ++index) into[index] = std::max(into[index], other[index]);
}

uint64_t at(const Clock& clock, int id) { return static_cast<size_t>(id) < clock.size() ? clock[static_cast<size_t>(id)] : 0; }

std::string stream_name(const StreamState& stream) {
    return stream.legacy ? std::string("the legacy default stream") : "stream " + std::to_string(stream.id);
}

std::string allocation_name(const Allocation& allocation) {
    std::ostringstream text;
    text << (allocation.pinned ? "pinned host allocation " : "device allocation ")
         << static_cast<const void*>(allocation.base) << " (" << allocation.bytes << " bytes)";
    return text.str();
}

// The first conflicting access on another stream that `clock` is not ordered after, as a message.
std::string find_race(const StreamState& stream, const Clock& clock, const Access& access,
                      const std::string& description) {
    const Allocation& allocation = *access.allocation;
    for (size_t other = 0; other < allocation.accesses.size(); ++other) {
        if (static_cast<int>(other) == stream.id) continue;
        const StreamAccesses& record = allocation.accesses[other];
        const StreamState& other_stream = *streams().all[other];
        const uint64_t ordered = at(clock, static_cast<int>(other));
        const bool write_unordered = record.last_write > ordered;
        const bool read_unordered = access.writes && record.last_read > ordered;
        if (!write_unordered && !read_unordered) continue;
        std::ostringstream text;
        text << "race on " << allocation_name(allocation) << ": " << description << " on " << stream_name(stream)
             << (access.writes ? " writes it" : " reads it") << ", but "
             << (write_unordered ? *record.writer + " writes it" : *record.reader + " reads it") << " on "
             << stream_name(other_stream)
             << " and nothing orders the two (a missing cudaStreamWaitEvent or synchronization)";
        return text.str();
    }
    return {};
}

} // namespace

StreamState* legacy_stream() { return streams().all.front().get(); }

StreamState* find_stream(cudaStream_t handle) {
    if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) return legacy_stream();
    auto* stream = reinterpret_cast<StreamState*>(handle);
    return streams().live.count(stream) != 0 ? stream : nullptr;
}

StreamState* create_stream(bool blocking) {
    Streams& state = streams();
    auto stream = std::make_unique<StreamState>();
    stream->id = static_cast<int>(state.all.size());
    stream->blocking = blocking;
    stream->tail = state.host;
    StreamState* created = stream.get();
    state.all.push_back(std::move(stream));
    state.live.insert(created);
    return created;
}

void destroy_stream(StreamState* stream) {
    // A real stream finishes its queued work after cudaStreamDestroy returns; running it now is one such
    // order, and the host is not ordered after it.
    run_all(*stream);
    stream->destroyed = true;
    streams().live.erase(stream);
}

cudaError_t enqueue(StreamState& stream, Operation&& operation, const std::vector<Access>& accesses) {
    if (sticky_error() != cudaSuccess) return sticky_error();
    Streams& state = streams();
    // The legacy default stream and blocking streams wait for each other's earlier work (a destroyed
    // stream's too: it may still be running).
    for (const auto& owned : state.all) {
        StreamState* other = owned.get();
        if (other == &stream || other->enqueued == 0) continue;
        if ((stream.legacy && other->blocking && !other->legacy) || (!stream.legacy && stream.blocking && other->legacy)) {
            operation.waits.emplace_back(other, other->enqueued);
            join(stream.tail, other->tail);
        }
    }
    join(stream.tail, state.host);
    if (stream.tail.size() <= static_cast<size_t>(stream.id)) stream.tail.resize(static_cast<size_t>(stream.id) + 1, 0);
    const uint64_t sequence = stream.enqueued + 1;
    stream.tail[static_cast<size_t>(stream.id)] = sequence;
    for (const Access& access : accesses) {
        const std::string race = find_race(stream, stream.tail, access, *operation.description);
        if (!race.empty()) return raise_fault(cudaErrorIllegalState, race);
    }
    for (const Access& access : accesses) {
        std::vector<StreamAccesses>& records = access.allocation->accesses;
        if (records.size() <= static_cast<size_t>(stream.id)) records.resize(static_cast<size_t>(stream.id) + 1);
        StreamAccesses& record = records[static_cast<size_t>(stream.id)];
        if (access.writes) {
            record.last_write = sequence;
            record.writer = operation.description;
        } else {
            record.last_read = sequence;
            record.reader = operation.description;
        }
    }
    stream.enqueued = sequence;
    count_operation(*operation.description);
    stream.pending.push_back(std::move(operation));
    return cudaSuccess;
}

namespace {
std::map<std::string, uint64_t>& operation_counts() {
    static std::map<std::string, uint64_t> counts;
    return counts;
}
} // namespace

void count_operation(const std::string& description) {
    // The kind: a kernel's name, the cuBLAS call, or the runtime call, without the sizes that follow.
    std::string kind = description;
    if (kind.rfind("kernel ", 0) == 0) kind = kind.substr(7);
    const size_t cut = kind.find_first_of(" (");
    if (cut != std::string::npos && description.rfind("kernel ", 0) != 0) kind = kind.substr(0, cut);
    ++operation_counts()[kind];
}

std::map<std::string, uint64_t> stream_operations() {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    return operation_counts();
}

void reset_stream_operations() {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    operation_counts().clear();
}

void run_until(StreamState& stream, uint64_t sequence) {
    while (stream.completed < sequence && !stream.pending.empty() && sticky_error() == cudaSuccess) {
        Operation operation = std::move(stream.pending.front());
        stream.pending.pop_front();
        for (const auto& [other, other_sequence] : operation.waits) run_until(*other, other_sequence);
        if (sticky_error() != cudaSuccess) return;
        ++stream.completed;
        if (operation.run) operation.run();
    }
}

void run_all(StreamState& stream) { run_until(stream, stream.enqueued); }

void order_host_after(const Clock& clock) { join(streams().host, clock); }

void synchronize_stream(StreamState& stream) {
    run_all(stream);
    order_host_after(stream.tail);
}

void synchronize_device() {
    Streams& state = streams();
    for (const auto& stream : state.all) synchronize_stream(*stream);
}

// A fault ends the context: nothing queued will ever run.
void drop_pending_work() {
    for (const auto& stream : streams().all) {
        stream->pending.clear();
        stream->completed = stream->enqueued;
    }
}

EventState* find_event(cudaEvent_t handle) {
    auto* event = reinterpret_cast<EventState*>(handle);
    return streams().events.count(event) != 0 ? event : nullptr;
}

EventState* create_event(unsigned flags) {
    auto* event = new EventState();
    event->flags = flags;
    streams().events.insert(event);
    return event;
}

void destroy_event(EventState* event) {
    streams().events.erase(event);
    delete event;
}

cudaError_t record_event(EventState& event, StreamState& stream) {
    auto completed_at = std::make_shared<std::chrono::steady_clock::time_point>();
    Operation operation{std::make_shared<const std::string>("cudaEventRecord"),
                        [completed_at] { *completed_at = std::chrono::steady_clock::now(); },
                        {}};
    const cudaError_t status = enqueue(stream, std::move(operation), {});
    if (status != cudaSuccess) return status;
    event.completed_at = std::move(completed_at);
    event.recorded = true;
    event.stream = &stream;
    event.sequence = stream.enqueued;
    event.clock = stream.tail;
    return cudaSuccess;
}

cudaError_t wait_event(StreamState& stream, const EventState& event) {
    if (!event.recorded) return cudaSuccess; // waiting for a never-recorded event waits for nothing
    Operation operation{std::make_shared<const std::string>("cudaStreamWaitEvent"), {}, {}};
    operation.waits.emplace_back(event.stream, event.sequence);
    join(stream.tail, event.clock);
    return enqueue(stream, std::move(operation), {});
}

void synchronize_event(const EventState& event) {
    if (!event.recorded) return;
    run_until(*event.stream, event.sequence);
    join(streams().host, event.clock);
}

} // namespace engine::emulator
