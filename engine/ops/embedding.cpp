// embedding: token table plus learned position table (GPT), or the token table alone (Llama), with token-range
// checks before any write.
#include <optional>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;
namespace {

template <typename T>
T* data_or_null(const Tensor& tensor) {
    return tensor.defined() ? tensor.data<T>() : nullptr;
}

// Both forms: position_table undefined is the plain lookup, whose kernels get null position pointers (no add in
// forward, no position gradient in backward); a defined one takes exactly GPT's path, with position rows t or, for
// packed documents, positions[b,t].
Tensor embedding_lookup(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                        const Tensor& positions) {
    constexpr const char* op = "embedding";
    const bool with_positions = position_table.defined();
    ENGINE_CHECK(tokens.dtype() == DType::i32 && tokens.dim() == 2,
                 op << ": tokens " << tokens.describe() << " must be (B,T) i32");
    if (with_positions) {
        ENGINE_CHECK(token_table.dim() == 2 && position_table.dim() == 2,
                     op << ": tables " << token_table.describe() << ", " << position_table.describe()
                        << " must be 2-D");
        ENGINE_CHECK(token_table.size(1) == position_table.size(1),
                     op << ": token table " << shape_string(token_table.shape()) << " and position table "
                        << shape_string(position_table.shape()) << " have different widths");
    } else {
        ENGINE_CHECK(token_table.dim() == 2, op << ": token table " << token_table.describe() << " must be 2-D");
    }
    check_same_device(op, tokens, token_table);
    if (with_positions) {
        check_same_device(op, tokens, position_table);
        check_same_dtype(op, token_table, position_table);
    }
    const int batch = static_cast<int>(tokens.size(0)), time = static_cast<int>(tokens.size(1));
    const int channels = static_cast<int>(token_table.size(1));
    const int64_t vocabulary = token_table.size(0);
    if (with_positions)
        ENGINE_CHECK(time <= position_table.size(0), op << ": sequence length " << time
                                                        << " exceeds the position table "
                                                        << shape_string(position_table.shape()));
    if (positions.defined())
        check_document_positions(op, positions, batch, time, tokens.device(), position_table.size(0));
    const int32_t* position_rows = positions.defined() ? positions.data<int32_t>() : nullptr; // (B,T) or null
    const std::vector<int32_t> host_tokens = tokens.to_vector<int32_t>();
    for (size_t index = 0; index < host_tokens.size(); ++index)
        ENGINE_CHECK(host_tokens[index] >= 0 && host_tokens[index] < vocabulary,
                     op << ": token id " << host_tokens[index] << " at flat index " << index
                        << " is outside the vocabulary [0," << vocabulary << ")");

    Tensor out = Tensor::empty({batch, time, channels}, token_table.dtype(), tokens.device()); // (B,T,C)
    if (out.device() == Device::cpu) {
        dispatch_cpu(op, out.dtype(), [&]<typename T>() {
            kernels::cpu::embedding_forward<T>(out.data<T>(), tokens.data<int32_t>(), token_table.data<T>(),
                                               data_or_null<T>(position_table), position_rows, batch, time, channels);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, out.dtype(), [&]<typename T>() {
            kernels::cuda::embedding_forward(out.data<T>(), tokens.data<int32_t>(), token_table.data<T>(),
                                             data_or_null<T>(position_table), position_rows, batch, time, channels,
                                             cuda::compute_stream());
        });
    }

    GradTarget token_target(token_table);
    const GradTarget position_target = with_positions ? GradTarget(position_table) : GradTarget();
    std::vector<const Tensor*> inputs = {&token_table};
    if (with_positions) inputs.push_back(&position_table);
    record_node(op, inputs, {&out},
                [=, saved_tokens = tokens, saved_positions = positions,
                 output_id = out.id()](BackwardContext& context) {
                    const int32_t* rows = saved_positions.defined() ? saved_positions.data<int32_t>() : nullptr;
                    Tensor dout = context.output_grad(output_id);
                    // Parameter gradients: in compute_dtype (f32 for bf16 tables), so micro-batches add up
                    // unrounded. The kernel writes every table there is; one that needs no gradient gets scratch.
                    const DType grad_dtype = compute_dtype(dout.dtype());
                    Tensor dtoken = context.parameter_grad(token_target);
                    // Without a position table dposition stays undefined: the kernels get null and skip it.
                    Tensor dposition = with_positions ? context.parameter_grad(position_target) : Tensor();
                    if (!dtoken.defined())
                        dtoken = Tensor::zeros(token_target.shape, grad_dtype, dout.device(), MemoryCategory::workspace);
                    if (with_positions && !dposition.defined())
                        dposition = Tensor::zeros(position_target.shape, grad_dtype, dout.device(),
                                                  MemoryCategory::workspace);
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::embedding_backward<T>(
                                dtoken.data<Compute<T>>(), data_or_null<Compute<T>>(dposition), dout.data<T>(),
                                saved_tokens.data<int32_t>(), rows, batch, time, channels);
                        });
                    } else {
                        // The kernel wants the positions grouped by token. Built here, in backward, its one
                        // consumer: forward (and no-grad forwards) pay nothing, and the upload is workspace that
                        // lives only while the kernels run. Ids the trainer uploaded carry their host copy, so
                        // to_vector reads no device memory; other token tensors cost one device read here.
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            const std::vector<int32_t> host_tokens = saved_tokens.to_vector<int32_t>();
                            const kernels::cuda::TokenGroups groups =
                                kernels::cuda::group_positions_by_token(host_tokens.data(), batch * time);
                            const cuda::Scratch<int32_t> device_groups(groups.packed.size(), cuda::compute_stream());
                            cuda::copy(device_groups.get(), Device::cuda, groups.packed.data(), Device::cpu,
                                       groups.packed.size() * sizeof(int32_t));
                            // Packed documents: the position rows grouped the same way (one more small upload).
                            kernels::cuda::TokenGroups position_groups;
                            std::optional<cuda::Scratch<int32_t>> device_position_groups;
                            if (rows != nullptr) {
                                const std::vector<int32_t> host_positions = saved_positions.to_vector<int32_t>();
                                position_groups =
                                    kernels::cuda::group_positions_by_token(host_positions.data(), batch * time);
                                device_position_groups.emplace(position_groups.packed.size(), cuda::compute_stream());
                                cuda::copy(device_position_groups->get(), Device::cuda, position_groups.packed.data(),
                                           Device::cpu, position_groups.packed.size() * sizeof(int32_t));
                            }
                            kernels::cuda::embedding_backward(
                                dtoken.data<float>(), data_or_null<float>(dposition), dout.data<T>(),
                                device_groups.get(), groups.distinct,
                                device_position_groups ? device_position_groups->get() : nullptr,
                                position_groups.distinct, batch, time, channels, cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace

Tensor embedding(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                 const Tensor& positions) {
    ENGINE_CHECK(position_table.defined(), "embedding: the position table is undefined; call embedding(tokens, "
                                           "token_table) for the lookup without positions");
    return embedding_lookup(tokens, token_table, position_table, positions);
}

Tensor embedding(const Tensor& tokens, const Tensor& token_table) {
    return embedding_lookup(tokens, token_table, Tensor(), Tensor());
}

} // namespace engine
