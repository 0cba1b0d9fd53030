// Offload prefetching on the CPU backend: the same bookkeeping as on CUDA with synchronous copies, so the
// loss and every gradient must be bitwise those of plain offload (and of no checkpointing at all), and the
// prefetch must actually happen, one segment ahead, for exactly the segments that have one before them.
#include <gtest/gtest.h>

#include "tests/cuda/gpt_gradients.h"

namespace engine::test {
namespace {

using checkpoint::CheckpointPolicy;

constexpr int micro_batch_count = 3, batch = 3;

void expect_bitwise_equal(const GptGradients& actual, const GptGradients& expected, const std::string& what) {
    EXPECT_EQ(actual.loss, expected.loss) << what;
    ASSERT_EQ(actual.gradients.size(), expected.gradients.size()) << what;
    for (size_t index = 0; index < actual.gradients.size(); ++index) {
        EXPECT_EQ(actual.gradients[index].first, expected.gradients[index].first);
        EXPECT_EQ(actual.gradients[index].second, expected.gradients[index].second)
            << what << ": gradient of " << actual.gradients[index].first << " differs";
    }
}

size_t checkpointed_segments(const CheckpointPolicy& policy) {
    size_t count = 0;
    for (const checkpoint::Segment& segment : checkpoint::plan_segments(small_gpt_config().n_layer, policy))
        count += segment.checkpointed ? 1 : 0;
    return count;
}

TEST(OffloadPrefetch, GradientsAreBitwiseThoseWithoutPrefetch) {
    const auto batches = make_micro_batches(small_gpt_config(), micro_batch_count, batch);
    CheckpointPolicy plain;
    const GptGradients reference = accumulate_gpt_gradients(Device::cpu, plain, batches, batch);
    for (int every_n_layers : {1, 2}) {
        const std::string what = "every_n_layers " + std::to_string(every_n_layers);
        const GptGradients offloaded = accumulate_gpt_gradients(
            Device::cpu, checkpoint_policy(every_n_layers, true, false), batches, batch);
        checkpoint::reset_prefetched_segment_count();
        checkpoint::reset_recomputed_segment_count();
        const CheckpointPolicy policy = checkpoint_policy(every_n_layers, true, true);
        const GptGradients prefetched = accumulate_gpt_gradients(Device::cpu, policy, batches, batch);
        // 3 layers: every_n 1 gives 3 checkpointed segments, every_n 2 gives blocks 1 and 3; in each
        // backward all but the first segment in forward order have one before them to prefetch.
        const size_t segments = checkpointed_segments(policy);
        ASSERT_EQ(segments, every_n_layers == 1 ? 3u : 2u);
        EXPECT_EQ(checkpoint::recomputed_segment_count(), segments * micro_batch_count) << what;
        EXPECT_EQ(checkpoint::prefetched_segment_count(), (segments - 1) * micro_batch_count) << what;
        expect_bitwise_equal(prefetched, offloaded, what + ", prefetch vs offload");
        expect_bitwise_equal(prefetched, reference, what + ", prefetch vs no checkpointing");
    }
}

TEST(OffloadPrefetch, IgnoredWithoutOffload) {
    const auto batches = make_micro_batches(small_gpt_config(), 1, batch);
    checkpoint::reset_prefetched_segment_count();
    const GptGradients with_flag = accumulate_gpt_gradients(Device::cpu, checkpoint_policy(1, false, true), batches, batch);
    EXPECT_EQ(checkpoint::prefetched_segment_count(), 0u);
    const GptGradients without = accumulate_gpt_gradients(Device::cpu, checkpoint_policy(1, false, false), batches, batch);
    expect_bitwise_equal(with_flag, without, "prefetch without offload");
}

// Stale entries in the prefetch order: a forward whose tape was dropped, and one whose tape is still alive
// while another tape runs backward. Neither may be prefetched, and the real backward still prefetches its
// own segments and gets the gradients of a model that never saw the other forwards.
TEST(OffloadPrefetch, OtherForwardsAreNotPrefetched) {
    const nn::GPTConfig config = small_gpt_config();
    const auto batches = make_micro_batches(config, 1, batch);
    const CheckpointPolicy policy = checkpoint_policy(1, true, true);
    const GptGradients expected = // plain offload, no prefetch: an independent reference
        accumulate_gpt_gradients(Device::cpu, checkpoint_policy(1, true, false), batches, batch);

    nn::GPT model(config, 7, Device::cpu);
    model.set_checkpointing(policy);
    const Shape shape{batch, config.max_seq_len};
    const Tensor tokens = Tensor::from_vector<int32_t>(batches[0].tokens, shape, Device::cpu);
    const Tensor targets = Tensor::from_vector<int32_t>(batches[0].targets, shape, Device::cpu);
    (void)model.forward(tokens);
    current_tape().clear(); // abandoned: its segments expire
    Tape other_tape;
    {
        TapeScope scope(other_tape);
        (void)model.forward(tokens); // alive, recorded before the real forward, never backpropagated here
    }
    ASSERT_GT(other_tape.size(), 0u);

    checkpoint::reset_prefetched_segment_count();
    manual_seed(1234);
    int64_t num_items_in_batch = 0;
    for (int32_t target : batches[0].targets) num_items_in_batch += target != default_ignore_index ? 1 : 0;
    Tensor loss = multiply(cross_entropy(model.forward(tokens), targets, Reduction::sum),
                           1.0 / static_cast<double>(num_items_in_batch));
    backward(loss);
    EXPECT_EQ(checkpoint::prefetched_segment_count(), 2u); // segments 3 -> 2 -> 1, none of the other tape
    const auto named = model.named_parameters();
    ASSERT_EQ(named.size(), expected.gradients.size());
    for (size_t index = 0; index < named.size(); ++index)
        EXPECT_EQ(named[index].second.grad().to_vector<float>(), expected.gradients[index].second)
            << named[index].first;
}

} // namespace
} // namespace engine::test
