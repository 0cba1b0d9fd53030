// NF4 quantisation and dequantisation, the reference for kernels/cuda/nf4.cu (kernels/cpu/nf4_kernels.h says
// what each computes and why; tests/test_nf4.cpp holds them to bitsandbytes' bits).
#include "kernels/cpu/nf4_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

const std::array<float, 16> nf4_values = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

const std::array<float, 15>& nf4_thresholds() {
    static const std::array<float, 15> thresholds = [] {
        std::array<float, 15> out{};
        for (size_t i = 0; i < out.size(); ++i)
            out[i] = static_cast<float>((static_cast<double>(nf4_values[i]) + static_cast<double>(nf4_values[i + 1])) / 2.0);
        return out;
    }();
    return thresholds;
}

namespace {

// torch.linspace(start, end, steps) in f32 as torch (1.13, the build bitsandbytes' map was taken with) computes
// it, so that the map is bitsandbytes' to the bit: an element is one fused multiply-add from start (the first half)
// or from end (the second), except inside the vectorised loop, which fills pairs of 8-wide vectors by adding
// j · step (rounded) to such a base.
std::vector<float> linspace(float start, float end, int steps) {
    const float step = (end - start) / static_cast<float>(steps - 1);
    const int halfway = steps / 2;
    const auto element = [&](int i) {
        return i < halfway ? std::fma(step, static_cast<float>(i), start)
                           : std::fma(-step, static_cast<float>(steps - i - 1), end);
    };
    constexpr int width = 8;
    std::vector<float> out;
    int i = 0;
    for (; i + 2 * width <= steps; i += 2 * width)
        for (int vector = i; vector < i + 2 * width; vector += width) {
            const float base = element(vector);
            for (int j = 0; j < width; ++j) {
                const float increment = static_cast<float>(j) * step;
                out.push_back(base + increment);
            }
        }
    for (; i < steps; ++i) out.push_back(element(i));
    return out;
}

// The code of one normalised value: how many thresholds it exceeds.
uint8_t nf4_encode(float x) {
    uint8_t code = 0;
    for (float threshold : nf4_thresholds()) code += x > threshold ? 1 : 0;
    return code;
}

} // namespace

const std::array<float, 256>& dynamic_map() {
    // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i in [0, 7), the
    // midpoints of 2^i + 1 points spread evenly over [0.1, 1], times ±10^(i-6), in f32; then 0 and 1, sorted.
    static const std::array<float, 256> map = [] {
        std::vector<float> values;
        for (int exponent = 0; exponent < 7; ++exponent) {
            const std::vector<float> boundaries = linspace(0.1f, 1.0f, (1 << exponent) + 1);
            const float magnitude = static_cast<float>(std::pow(10.0, exponent - 6));
            for (size_t i = 0; i + 1 < boundaries.size(); ++i) {
                const float mean = (boundaries[i] + boundaries[i + 1]) / 2.0f;
                values.push_back(magnitude * mean);
                values.push_back(-magnitude * mean);
            }
        }
        values.push_back(0.0f);
        values.push_back(1.0f);
        std::sort(values.begin(), values.end());
        std::array<float, 256> out{};
        std::copy(values.begin(), values.end(), out.begin());
        out[0] = -1.0f; // bitsandbytes' CPU quantiser bounds its search so: values in [-1, 1] always find an entry
        return out;
    }();
    return map;
}

namespace {
// One block of 64 (or the last, shorter one): its absmax, and its codes, which fill whole bytes of its own.
void nf4_quantize_block(uint8_t* codes, float* absmax, const float* inp, int64_t n, int64_t block) {
    const int64_t first = block * nf4_block, last = std::min(n, first + nf4_block);
    float largest = 0.0f;
    for (int64_t i = first; i < last; ++i) largest = std::max(largest, std::fabs(inp[i]));
    absmax[block] = largest;
    const float scale = 1.0f / largest; // inf for an all-zero block: its 0 · inf are NaN, code 0, as bitsandbytes'
    for (int64_t i = first; i < last; i += 2) {
        const uint8_t high = nf4_encode(inp[i] * scale);
        const uint8_t low = i + 1 < last ? nf4_encode(inp[i + 1] * scale) : 0;
        codes[i / 2] = static_cast<uint8_t>(high << 4 | low);
    }
}
} // namespace

void nf4_quantize(uint8_t* codes, float* absmax, const float* inp, int64_t n) {
    parallel_for(ceil_div(n, nf4_block), items_per_chunk(nf4_block, costly_elements_per_chunk),
                 [&](int64_t begin, int64_t end) {
                     for (int64_t block = begin; block < end; ++block) nf4_quantize_block(codes, absmax, inp, n, block);
                 });
}

void nf4_quantize_scales(uint8_t* scale_codes, float* scale_absmax, float* offset, const float* absmax, int64_t blocks) {
    double sum = 0.0;
    for (int64_t b = 0; b < blocks; ++b) sum += absmax[b];
    const float mean = blocks == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(blocks));
    *offset = mean;
    const std::array<float, 256>& map = dynamic_map();
    const int64_t groups = ceil_div(blocks, nf4_scale_block);
    for (int64_t group = 0; group < groups; ++group) {
        const int64_t first = group * nf4_scale_block, last = std::min(blocks, first + nf4_scale_block);
        float largest = -std::numeric_limits<float>::max();
        for (int64_t b = first; b < last; ++b) largest = std::max(largest, std::fabs(absmax[b] - mean));
        scale_absmax[group] = largest;
        for (int64_t b = first; b < last; ++b) {
            const float normalised = (absmax[b] - mean) / largest;
            // The last entry not above it (the first when it is below them all), then its upper neighbour if
            // strictly nearer.
            const auto above = std::upper_bound(map.begin(), map.end(), normalised);
            int64_t code = above == map.begin() ? 0 : (above - map.begin()) - 1;
            if (code < 255 && std::fabs(normalised - map[code + 1]) < std::fabs(normalised - map[code])) ++code;
            scale_codes[b] = static_cast<uint8_t>(code);
        }
    }
}

void nf4_dequantize_scales(float* absmax, const uint8_t* scale_codes, const float* scale_absmax, float offset,
                           int64_t blocks) {
    const std::array<float, 256>& map = dynamic_map();
    for (int64_t b = 0; b < blocks; ++b) {
        const float scaled = map[scale_codes[b]] * scale_absmax[b / nf4_scale_block];
        absmax[b] = scaled + offset;
    }
}

// Block by block: the block's 16 possible values (each code's product with its absmax, rounded as the element-wise
// rule rounds it) are made once, and each byte of codes is then two lookups. The same products, so the same bits
// as one product an element, at a quarter of the multiplies and with no division or parity test an element: the
// first version, which had both, took 3.3 ns an element on this VM and a quarter of a QLoRA step (docs/PERF.md).
template <typename Scalar>
void nf4_dequantize(Scalar* out, const uint8_t* codes, const float* absmax, int64_t n) {
    parallel_for(ceil_div(n, nf4_block), items_per_chunk(nf4_block, cheap_elements_per_chunk),
                 [&](int64_t begin, int64_t end) {
                     for (int64_t block = begin; block < end; ++block) {
                         std::array<Scalar, 16> table;
                         for (size_t code = 0; code < table.size(); ++code)
                             table[code] = narrow<Scalar>(nf4_values[code] * absmax[block]);
                         const int64_t first = block * nf4_block, last = std::min(n, first + nf4_block);
                         // nf4_block is even, so every block starts on a whole byte; only the last may end inside one.
                         int64_t i = first;
                         for (; i + 1 < last; i += 2) {
                             const uint8_t pair = codes[i / 2];
                             out[i] = table[pair >> 4];
                             out[i + 1] = table[pair & 15];
                         }
                         if (i < last) out[i] = table[codes[i / 2] >> 4];
                     }
                 });
}

template void nf4_dequantize<float>(float*, const uint8_t*, const float*, int64_t);
template void nf4_dequantize<bfloat16>(bfloat16*, const uint8_t*, const float*, int64_t);

} // namespace engine::kernels::cpu
