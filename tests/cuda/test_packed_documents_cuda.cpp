// Packed documents on the CUDA device (the emulated one in CI): each document of a packed batch gets the loss and
// the gradients it gets alone on the same device (tests/packed_documents.h), GPT-2 and Llama, f32 and bf16, plain
// and checkpointed with offload; the device's kernels with positions are checked against their CPU twins in
// test_attention_kernels.cpp, test_bf16_gemm_attention.cpp, test_llama_kernels.cpp and the embedding tests.
#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "tests/llama_step.h"
#include "tests/packed_documents.h"

namespace engine::test {
namespace {

using checkpoint::CheckpointPolicy;

class PackedDocumentsCudaTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
    }
};

// f32 as on the CPU: 1e-5 of each tensor's scale. bf16 rounds every activation: the packed and the lone runs round
// at different tile boundaries (the key tiles are aligned to the row, not to the document), so each document's
// loss and gradients agree to bf16's resolution: 2e-2 of a tensor's scale (8 bits of mantissa, summed over the
// layers).
double bound_for(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 1e-5; }

TEST_F(PackedDocumentsCudaTest, EveryDocumentGetsItsOwnLossAndGradientsGpt2) {
    for (DType dtype : {DType::f32, DType::bf16})
        for (const CheckpointPolicy& policy : {CheckpointPolicy{}, CheckpointPolicy{true, 1, 1, true}})
            check_packed_model<nn::GPT>(packed_test_gpt_config(), Device::cuda, dtype, policy, bound_for(dtype),
                                        "GPT-2 on CUDA");
}

TEST_F(PackedDocumentsCudaTest, EveryDocumentGetsItsOwnLossAndGradientsLlama) {
    for (DType dtype : {DType::f32, DType::bf16})
        for (const CheckpointPolicy& policy : {CheckpointPolicy{}, CheckpointPolicy{true, 2, 1, true}})
            check_packed_model<nn::Llama>(small_llama_config(false), Device::cuda, dtype, policy, bound_for(dtype),
                                          "Llama on CUDA");
}

// The same packed batch on the device and on the CPU: the positions reach every kernel alike.
TEST_F(PackedDocumentsCudaTest, PackedLlamaMatchesTheCpu) {
    const nn::LlamaConfig config = small_llama_config(false);
    const Rows rows = packed_test_rows(config.vocab_size);
    nn::Llama on_cpu(config, 5, Device::cpu, DType::f32), on_device(config, 5, Device::cuda, DType::f32);
    const DocumentRun cpu = run_packed(on_cpu, rows, Device::cpu);
    const DocumentRun device = run_packed(on_device, rows, Device::cuda);
    expect_documents_match(device, cpu, 1e-5, "Llama packed, CUDA against the CPU");
}

} // namespace
} // namespace engine::test
