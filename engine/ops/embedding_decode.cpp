// embedding_at: the token and position embedding of positions that start past 0, for cached decoding.
// Inference only (engine/ops/decode.h); the kernels are embedding's, given the position table from row
// first_position on.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops/decode.h"

namespace engine {
using namespace detail;

Tensor embedding_at(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table, int first_position) {
    constexpr const char* op = "embedding_at";
    ENGINE_CHECK(tokens.dtype() == DType::i32 && tokens.dim() == 2,
                 op << ": tokens " << tokens.describe() << " must be (B,T) i32");
    ENGINE_CHECK(token_table.dim() == 2 && position_table.dim() == 2 && token_table.size(1) == position_table.size(1),
                 op << ": tables " << token_table.describe() << ", " << position_table.describe()
                    << " must be 2-D of one width");
    check_same_device(op, tokens, token_table);
    check_same_device(op, tokens, position_table);
    check_same_dtype(op, token_table, position_table);
    ENGINE_CHECK(tokens.numel() * token_table.size(1) <= 2147483647 && token_table.numel() <= 2147483647 &&
                     position_table.numel() <= 2147483647,
                 op << ": " << tokens.describe() << " with tables " << token_table.describe() << ", "
                    << position_table.describe() << " has more elements than the kernels index (2^31-1)");
    const int batch = static_cast<int>(tokens.size(0)), time = static_cast<int>(tokens.size(1));
    const int channels = static_cast<int>(token_table.size(1));
    ENGINE_CHECK(first_position >= 0 && int64_t(first_position) + time <= position_table.size(0),
                 op << ": positions [" << first_position << "," << int64_t(first_position) + time
                    << ") exceed the position table " << shape_string(position_table.shape()));
    const std::vector<int32_t> host_tokens = tokens.to_vector<int32_t>();
    for (size_t index = 0; index < host_tokens.size(); ++index)
        ENGINE_CHECK(host_tokens[index] >= 0 && host_tokens[index] < token_table.size(0),
                     op << ": token id " << host_tokens[index] << " at flat index " << index
                        << " is outside the vocabulary [0," << token_table.size(0) << ")");
    require_inference(op, token_table);
    require_inference(op, position_table);

    Tensor out = Tensor::empty({batch, time, channels}, token_table.dtype(), tokens.device()); // (B,T,C)
    const int64_t position_offset = int64_t(first_position) * channels; // rows first_position.. of the table
    if (out.device() == Device::cpu) {
        dispatch_cpu(op, out.dtype(), [&]<typename T>() {
            kernels::cpu::embedding_forward<T>(out.data<T>(), tokens.data<int32_t>(), token_table.data<T>(),
                                               position_table.data<T>() + position_offset, nullptr, batch, time,
                                               channels);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, out.dtype(), [&]<typename T>() {
            kernels::cuda::embedding_forward(out.data<T>(), tokens.data<int32_t>(), token_table.data<T>(),
                                             position_table.data<T>() + position_offset, nullptr, batch, time, channels,
                                             cuda::compute_stream());
        });
    }
    return out;
}

} // namespace engine
