// What each warp collective computes once every lane of its mask has arrived (emulator/scheduler.cpp
// gathers them): shuffles with PTX's segment rules, votes and integer reductions. Reading a lane outside
// the mask is undefined on the hardware, so it is reported rather than given a value.
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

#include "emulator/cuda_emulation.h"

namespace engine::emulator {
namespace {

constexpr int warp_lanes = 32;

bool in_mask(unsigned mask, int lane) { return lane >= 0 && lane < warp_lanes && (mask & (1u << lane)) != 0; }

enum class ShuffleMode { index, up, down, exclusive_or };

// The lane whose value `lane` receives, or `lane` itself where PTX returns the caller's own value. PTX
// reads only the low five bits of the lane or offset operand.
int shuffle_source(ShuffleMode mode, int lane, int operand_bits, int width) {
    const int operand = operand_bits & 31;
    const int segment_start = lane & ~(width - 1);
    const int segment_end = segment_start + width; // exclusive
    switch (mode) {
    case ShuffleMode::index: return segment_start + (operand & (width - 1));
    case ShuffleMode::up: return lane - operand < segment_start ? lane : lane - operand;
    case ShuffleMode::down: return lane + operand >= segment_end ? lane : lane + operand;
    case ShuffleMode::exclusive_or: {
        const int source = lane ^ operand;
        return source >= segment_end || source >= warp_lanes ? lane : source;
    }
    }
    return lane;
}

template <ShuffleMode mode>
void combine_shuffle(WarpExchange& exchange) {
    const unsigned mask = exchange.mask();
    for (int lane = 0; lane < warp_lanes; ++lane) {
        if (!in_mask(mask, lane)) continue;
        const LaneRequest& request = exchange.request(lane);
        const int width = request.width;
        if (width < 1 || width > warp_lanes || (width & (width - 1)) != 0) {
            exchange.fail(lane, (std::string(request.kind->name) + ": width " + std::to_string(width) +
                                 " is not a power of two from 1 to 32")
                                    .c_str());
        }
        const int source = shuffle_source(mode, lane, request.operand, width);
        if (!in_mask(mask, source)) {
            exchange.fail(lane, (std::string(request.kind->name) + " reads lane " + std::to_string(source) +
                                 ", which is not in the mask: its value is undefined")
                                    .c_str());
        }
        const LaneRequest& from = exchange.request(source);
        if (from.size != request.size) exchange.fail(lane, "lanes of one shuffle pass values of different sizes");
        std::memcpy(request.output, from.input, request.size);
    }
}

unsigned ballot_of(WarpExchange& exchange) {
    const unsigned mask = exchange.mask();
    unsigned ballot = 0;
    for (int lane = 0; lane < warp_lanes; ++lane) {
        if (!in_mask(mask, lane)) continue;
        int predicate = 0;
        std::memcpy(&predicate, exchange.request(lane).input, sizeof(int));
        if (predicate != 0) ballot |= 1u << lane;
    }
    return ballot;
}

void broadcast(WarpExchange& exchange, unsigned value) {
    for (int lane = 0; lane < warp_lanes; ++lane) {
        if (in_mask(exchange.mask(), lane)) std::memcpy(exchange.request(lane).output, &value, sizeof(unsigned));
    }
}

void combine_ballot(WarpExchange& exchange) { broadcast(exchange, ballot_of(exchange)); }
void combine_any(WarpExchange& exchange) { broadcast(exchange, ballot_of(exchange) != 0 ? 1u : 0u); }
void combine_all(WarpExchange& exchange) { broadcast(exchange, ballot_of(exchange) == exchange.mask() ? 1u : 0u); }
void combine_sync_warp(WarpExchange&) {}

enum class Reduction { add, min, max };

template <typename T, Reduction reduction>
T reduce_lanes(WarpExchange& exchange) {
    bool first = true;
    T result{};
    for (int lane = 0; lane < warp_lanes; ++lane) {
        if (!in_mask(exchange.mask(), lane)) continue;
        T value;
        std::memcpy(&value, exchange.request(lane).input, sizeof(T));
        if (first) {
            result = value;
            first = false;
        } else if constexpr (reduction == Reduction::add) {
            // 32-bit wrap-around, as PTX defines it for both signednesses (and without UB here)
            result = std::bit_cast<T>(std::bit_cast<uint32_t>(result) + std::bit_cast<uint32_t>(value));
        } else if constexpr (reduction == Reduction::min) {
            result = value < result ? value : result;
        } else {
            result = value > result ? value : result;
        }
    }
    return result;
}

template <Reduction reduction>
void combine_reduce(WarpExchange& exchange) {
    const bool is_signed = exchange.request(std::countr_zero(exchange.mask())).operand == 1;
    unsigned bits;
    if (is_signed) {
        const int value = reduce_lanes<int, reduction>(exchange);
        std::memcpy(&bits, &value, sizeof(bits));
    } else {
        bits = reduce_lanes<unsigned, reduction>(exchange);
    }
    broadcast(exchange, bits);
}

} // namespace

const CollectiveKind sync_warp_kind{"__syncwarp", combine_sync_warp};
const CollectiveKind shuffle_index_kind{"__shfl_sync", combine_shuffle<ShuffleMode::index>};
const CollectiveKind shuffle_up_kind{"__shfl_up_sync", combine_shuffle<ShuffleMode::up>};
const CollectiveKind shuffle_down_kind{"__shfl_down_sync", combine_shuffle<ShuffleMode::down>};
const CollectiveKind shuffle_xor_kind{"__shfl_xor_sync", combine_shuffle<ShuffleMode::exclusive_or>};
const CollectiveKind ballot_kind{"__ballot_sync", combine_ballot};
const CollectiveKind any_kind{"__any_sync", combine_any};
const CollectiveKind all_kind{"__all_sync", combine_all};
const CollectiveKind reduce_add_kind{"__reduce_add_sync", combine_reduce<Reduction::add>};
const CollectiveKind reduce_min_kind{"__reduce_min_sync", combine_reduce<Reduction::min>};
const CollectiveKind reduce_max_kind{"__reduce_max_sync", combine_reduce<Reduction::max>};

} // namespace engine::emulator
