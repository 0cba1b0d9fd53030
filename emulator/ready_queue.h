// Inside the emulator: the orders a schedule imposes, on a block's ready threads (ReadyQueue) and on a
// grid's blocks (BlockOrder).
#pragma once

#include <bit>
#include <cstdint>
#include <deque>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "emulator/scheduler.h"

namespace engine::emulator::detail {

// Threads that may run, in the order the schedule wants them.
class ReadyQueue {
public:
    void reset(ScheduleChoice choice, int thread_count) {
        schedule_ = choice.schedule;
        random_.seed(choice.seed);
        fifo_.clear();
        pool_.clear();
        bits_.assign(static_cast<size_t>((thread_count + 63) / 64), 0);
        count_ = 0;
    }
    bool reverse() const { return schedule_ == Schedule::round_robin_reverse || schedule_ == Schedule::greedy_reverse; }
    void push(int thread) {
        ++count_;
        switch (schedule_) {
        case Schedule::round_robin:
        case Schedule::round_robin_reverse: fifo_.push_back(thread); return;
        case Schedule::greedy:
        case Schedule::greedy_reverse: bits_[static_cast<size_t>(thread) / 64] |= uint64_t(1) << (thread % 64); return;
        case Schedule::random: pool_.push_back(thread); return;
        }
    }
    bool empty() const { return count_ == 0; }
    int pop() {
        --count_;
        switch (schedule_) {
        case Schedule::round_robin:
        case Schedule::round_robin_reverse: {
            const int thread = fifo_.front();
            fifo_.pop_front();
            return thread;
        }
        case Schedule::greedy:
            for (size_t word = 0; word < bits_.size(); ++word) {
                if (bits_[word] != 0) return take(word, std::countr_zero(bits_[word]));
            }
            break;
        case Schedule::greedy_reverse:
            for (size_t word = bits_.size(); word-- > 0;) {
                if (bits_[word] != 0) return take(word, 63 - std::countl_zero(bits_[word]));
            }
            break;
        case Schedule::random: {
            const size_t pick = std::uniform_int_distribution<size_t>(0, pool_.size() - 1)(random_);
            const int thread = pool_[pick];
            pool_[pick] = pool_.back();
            pool_.pop_back();
            return thread;
        }
        }
        throw std::logic_error("emulator ready queue is inconsistent");
    }

private:
    int take(size_t word, int bit) {
        bits_[word] &= ~(uint64_t(1) << bit);
        return static_cast<int>(word * 64) + bit;
    }
    Schedule schedule_ = Schedule::round_robin;
    std::deque<int> fifo_;
    std::vector<uint64_t> bits_;
    std::vector<int> pool_;
    std::mt19937_64 random_;
    int count_ = 0;
};


// The order blocks run in: forward, reverse, or a seeded pseudo-random permutation (an affine map modulo the
// block count, so that even a grid of 2^31 blocks needs no table).
class BlockOrder {
public:
    BlockOrder(Schedule schedule, uint64_t seed, uint64_t count) : count_(count) {
        if (schedule == Schedule::round_robin_reverse || schedule == Schedule::greedy_reverse) {
            multiplier_ = count - 1; // i -> (count - 1) * (i + 1) mod count = count - 1 - i
            offset_ = count - 1;
        } else if (schedule == Schedule::random && count > 1) {
            std::mt19937_64 random(seed);
            do {
                multiplier_ = random() % count;
            } while (std::gcd(multiplier_, count) != 1);
            offset_ = random() % count;
        }
    }
    uint64_t operator[](uint64_t position) const {
        return static_cast<uint64_t>((static_cast<unsigned __int128>(multiplier_) * position + offset_) % count_);
    }

private:
    uint64_t count_, multiplier_ = 1, offset_ = 0;
};

} // namespace engine::emulator::detail
