// linear_cross_entropy, the streaming LM head: bitwise the fused classifier over the whole logits with one
// chunk; within the chunked summation's bound with several; float64 central differences; an unexpected
// upstream gradient; no-grad; a weight that is no leaf; bad input changing nothing; and the trainer (GPT-2 and
// Llama, tied and untied, f32 and bf16, accumulation and padded labels) against the unstreamed head.
#include <cmath>

#include "expect_error.h"
#include "gradcheck.h"
#include "nn/llama.h"
#include "optim/trainer.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

constexpr int batch = 2, time_steps = 7, width = 6, vocabulary = 13, padded = 16;
constexpr int rows = batch * time_steps;

class StreamingHead : public TapeTest {
protected:
    void SetUp() override {
        TapeTest::SetUp();
        std::vector<int32_t> labels(rows);
        std::uniform_int_distribution<int32_t> label(0, vocabulary - 1);
        for (int32_t& value : labels) value = label(generator);
        labels[2] = labels[9] = labels[13] = default_ignore_index;
        targets = Tensor::from_vector<int32_t>(labels, {batch, time_steps}, Device::cpu);
        // The weight's padding rows are zero, as GPT-2's padded token table's.
        std::vector<double> values = weight.to_vector<double>();
        std::fill(values.begin() + vocabulary * width, values.end(), 0.0);
        weight = Tensor::from_vector<double>(values, {padded, width}, Device::cpu);
        weight.set_requires_grad(true);
    }

    Tensor leaf_as(const Tensor& tensor, DType dtype) {
        Tensor converted = tensor.dtype() == dtype ? tensor.clone() : Tensor::empty(tensor.shape(), dtype, Device::cpu);
        if (tensor.dtype() != dtype) convert_into(converted, tensor);
        converted.set_requires_grad(true);
        return converted;
    }

    struct Gradients {
        std::vector<double> loss, dhidden, dweight;
    };
    // loss = factor · head(hidden, weight) → backward with fresh leaves in `dtype`; chunk 0: the fused
    // classifier over matmul's logits, as the trainer's unstreamed head.
    Gradients run(DType dtype, int chunk, Reduction reduction, double factor, double expected) {
        current_tape().clear();
        Tensor h = leaf_as(hidden, dtype), w = leaf_as(weight, dtype);
        Tensor loss;
        {
            const Tensor head = chunk == 0 ? cross_entropy_in_place(matmul(h, w, true), targets, reduction, expected,
                                                                    default_ignore_index, vocabulary)
                                           : linear_cross_entropy(h, w, targets, reduction, chunk, expected,
                                                                  default_ignore_index, vocabulary);
            loss = multiply(head, factor);
        }
        Gradients gradients;
        gradients.loss = cast(loss, DType::f64).to_vector<double>();
        backward(loss);
        gradients.dhidden = cast(h.grad(), DType::f64).to_vector<double>();
        gradients.dweight = cast(w.grad(), DType::f64).to_vector<double>();
        return gradients;
    }

    Tensor hidden = random_leaf(generator, {batch, time_steps, width});
    Tensor weight = random_leaf(generator, {padded, width}, 0.7);
    Tensor targets;
};

// One chunk covering every row runs the same GEMMs and the same kernel as the fused classifier over the whole
// logits: the same bits, in f64, f32 and bf16, for sum and mean, with ignored rows and padded columns.
TEST_F(StreamingHead, OneChunkIsBitwiseTheFusedClassifier) {
    for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
        for (const Reduction reduction : {Reduction::sum, Reduction::mean}) {
            const double factor = 1.0 / 11.0;
            const Gradients whole = run(dtype, 0, reduction, factor, factor);
            for (const int chunk : {rows, rows + 5}) {
                const Gradients streamed = run(dtype, chunk, reduction, factor, factor);
                const std::string what = std::string(dtype_name(dtype)) + " chunk " + std::to_string(chunk);
                EXPECT_EQ(streamed.loss, whole.loss) << what;
                EXPECT_EQ(streamed.dhidden, whole.dhidden) << what;
                EXPECT_EQ(streamed.dweight, whole.dweight) << what;
            }
        }
    }
}

// Several chunks: the loss is the per-row losses summed in row order, so it keeps its bits; d(hidden) is row by
// row; d(weight) is the same products summed chunk by chunk. Each element's two sums (k = rows terms, in f32
// or f64) differ by at most 2·rows·u·Σ|terms|, the standard bound of a recursive sum twice over; the f64
// reference gives the terms' magnitudes. Repeated runs give the same bits.
TEST_F(StreamingHead, ChunksAgreeWithinTheSummationBoundAndRepeatBitwise) {
    const double factor = 1.0 / 11.0;
    const Gradients reference = run(DType::f64, 0, Reduction::sum, factor, factor);
    // Σ_rows |d(logits)[row,v] · hidden[row,c]| per element of d(weight), from the f64 logits gradient.
    std::vector<double> magnitude(reference.dweight.size(), 0.0);
    {
        current_tape().clear();
        Tensor logits = matmul(hidden.detach(), weight.detach(), true);
        logits.set_requires_grad(true);
        Tensor loss = multiply(cross_entropy(logits, targets, Reduction::sum), factor);
        backward(loss);
        const std::vector<double> dlogits = logits.grad().to_vector<double>();
        const std::vector<double> values = hidden.to_vector<double>();
        for (int row = 0; row < rows; ++row)
            for (int v = 0; v < padded; ++v)
                for (int c = 0; c < width; ++c)
                    magnitude[static_cast<size_t>(v * width + c)] +=
                        std::fabs(dlogits[static_cast<size_t>(row * padded + v)] * values[static_cast<size_t>(row * width + c)]);
    }
    for (const DType dtype : {DType::f64, DType::f32}) {
        const double unit = dtype == DType::f64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
        const Gradients whole = run(dtype, 0, Reduction::sum, factor, factor);
        for (const int chunk : {1, 3, 4, 8}) {
            const Gradients streamed = run(dtype, chunk, Reduction::sum, factor, factor);
            const std::string what = std::string(dtype_name(dtype)) + " chunk " + std::to_string(chunk);
            EXPECT_EQ(streamed.loss, whole.loss) << what;
            ASSERT_EQ(streamed.dhidden.size(), whole.dhidden.size());
            for (size_t i = 0; i < whole.dhidden.size(); ++i)
                EXPECT_NEAR(streamed.dhidden[i], whole.dhidden[i], 4 * padded * unit * (1 + std::fabs(whole.dhidden[i])))
                    << what << " d(hidden) " << i;
            double worst = 0.0;
            for (size_t i = 0; i < whole.dweight.size(); ++i) {
                const double bound = 2.0 * rows * unit * magnitude[i] + 1e-300;
                EXPECT_LE(std::fabs(streamed.dweight[i] - whole.dweight[i]), bound) << what << " d(weight) " << i;
                worst = std::max(worst, std::fabs(streamed.dweight[i] - whole.dweight[i]) / bound);
            }
            std::printf("[ measured ] %s: d(weight) off by at most %.3g of the bound\n", what.c_str(), worst);
            const Gradients again = run(dtype, chunk, Reduction::sum, factor, factor);
            EXPECT_EQ(again.dweight, streamed.dweight) << what;
            EXPECT_EQ(again.dhidden, streamed.dhidden) << what;
        }
    }
}

TEST_F(StreamingHead, GradientsMatchCentralDifferences) {
    for (const Reduction reduction : {Reduction::sum, Reduction::mean}) {
        for (const int chunk : {1, 5, rows}) {
            const auto loss = [&] {
                return multiply(linear_cross_entropy(hidden, weight, targets, reduction, chunk, 0.5,
                                                     default_ignore_index, vocabulary),
                                0.5);
            };
            EXPECT_GRADCHECK(gradcheck(loss, {hidden, weight}), "linear_cross_entropy chunk " + std::to_string(chunk));
        }
    }
}

// Promised 1, brought 0.37 · 2: backward rescales d(hidden) and adds the difference into d(weight).
TEST_F(StreamingHead, AnUnexpectedUpstreamGradientIsCorrectedInBackward) {
    for (const int chunk : {3, rows}) {
        const Gradients expected = run(DType::f64, 0, Reduction::mean, 0.74, 0.74);
        const Gradients corrected = run(DType::f64, chunk, Reduction::mean, 0.74, 1.0);
        for (size_t i = 0; i < expected.dhidden.size(); ++i)
            EXPECT_NEAR(corrected.dhidden[i], expected.dhidden[i], 1e-14) << "d(hidden) " << i;
        for (size_t i = 0; i < expected.dweight.size(); ++i)
            EXPECT_NEAR(corrected.dweight[i], expected.dweight[i], 1e-14) << "d(weight) " << i;
        EXPECT_EQ(corrected.loss, expected.loss);
    }
}

// Under no-grad only the loss is computed (over the real columns), and no gradient buffer is touched.
TEST_F(StreamingHead, NoGradComputesTheLossAloneAndWritesNoGradient) {
    const Gradients trained = run(DType::f64, 4, Reduction::sum, 1.0, 1.0);
    zero_grad({weight});
    NoGradGuard no_grad;
    for (const int chunk : {1, 4, rows}) {
        const Tensor loss = linear_cross_entropy(hidden, weight, targets, Reduction::sum, chunk, 1.0,
                                                 default_ignore_index, vocabulary);
        EXPECT_NEAR(loss.item(), trained.loss[0], 1e-12) << "chunk " << chunk;
    }
    for (double value : weight.grad().to_vector<double>()) EXPECT_EQ(value, 0.0);
    EXPECT_TRUE(current_tape().empty());
}

// A weight computed by an op (no persistent buffer) gets its gradient through the walk, as matmul's would.
TEST_F(StreamingHead, AWeightThatIsNoLeafGetsItsGradientInBackward) {
    const auto gradients = [&](bool streamed) {
        current_tape().clear();
        zero_grad({hidden, weight});
        const Tensor scaled = multiply(weight, 1.5); // (Vp,C), no leaf
        const Tensor head = streamed ? linear_cross_entropy(hidden, scaled, targets, Reduction::sum, 3, 1.0,
                                                            default_ignore_index, vocabulary)
                                     : cross_entropy_in_place(matmul(hidden, scaled, true), targets, Reduction::sum,
                                                              1.0, default_ignore_index, vocabulary);
        backward(head);
        return std::make_pair(hidden.grad().to_vector<double>(), weight.grad().to_vector<double>());
    };
    const auto plain = gradients(false), streamed = gradients(true);
    for (size_t i = 0; i < plain.first.size(); ++i) EXPECT_NEAR(streamed.first[i], plain.first[i], 1e-14);
    for (size_t i = 0; i < plain.second.size(); ++i) EXPECT_NEAR(streamed.second[i], plain.second[i], 1e-14);
}

// Each refusal names the op and what was wrong, before any gradient is written.
TEST_F(StreamingHead, BadInputIsRefusedBeforeAnythingChanges) {
    zero_grad({weight});
    const auto head = [&](const Tensor& h, const Tensor& w, const Tensor& t, int64_t chunk, Reduction reduction,
                          int classes) {
        return linear_cross_entropy(h, w, t, reduction, chunk, 1.0, default_ignore_index, classes);
    };
    expect_error([&] { head(hidden, weight, targets, 0, Reduction::sum, vocabulary); }, {"chunk_rows 0 must be >= 1"});
    expect_error([&] { head(hidden, weight, targets, -3, Reduction::sum, vocabulary); }, {"chunk_rows -3"});
    expect_error([&] { head(hidden, random_leaf(generator, {padded, width + 1}), targets, 4, Reduction::sum, vocabulary); },
                 {"widths differ"});
    expect_error([&] { head(hidden, weight, targets.reshape({rows}), 4, Reduction::sum, vocabulary); },
                 {"linear_cross_entropy: targets"});
    expect_error([&] { head(hidden, weight, targets, 4, Reduction::none, vocabulary); }, {"reduction none"});
    expect_error([&] { head(hidden, weight, targets, 4, Reduction::sum, padded + 1); }, {"vocabulary 17"});
    std::vector<int32_t> labels = targets.to_vector<int32_t>();
    labels[5] = vocabulary; // a padding column is no class
    expect_error([&] { head(hidden, weight, Tensor::from_vector<int32_t>(labels, {batch, time_steps}, Device::cpu), 4,
                            Reduction::sum, vocabulary); },
                 {"label 13 at flat index 5 is outside [0,13)"});
    for (double value : weight.grad().to_vector<double>()) EXPECT_EQ(value, 0.0);
    EXPECT_TRUE(current_tape().empty());
}

// The trainer with loss chunks against the whole logits: GPT-2 (tied, padded vocabulary) and Llama (tied and
// untied), f32 and bf16, two micro-batches with padded labels. One chunk of every token: the same bits after
// three steps; small chunks: the same losses to rounding (measured equal on this CPU BLAS, whose GEMM adds each
// product into C in k order, so chunking the rows changes no sum; the bounds leave room for a BLAS that splits
// K: f32 the head-gradient rounding through AdamW, bf16 one rounding of a working copy).
struct TrainedRun {
    std::vector<double> losses;
    std::vector<float> weights;
    double evaluated = 0.0; // Trainer::evaluate over two fresh batches after the steps
};

TrainedRun train(const std::string& model_name, Precision precision, int loss_chunk) {
    current_tape().clear();
    const nn::ModelConfig config = nn::ModelConfig::named(model_name);
    const std::unique_ptr<nn::CausalLM> model = config.build(5, Device::cpu, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = 2;
    trainer_config.shape.gradient_accumulation_steps = 2;
    trainer_config.shape.precision = precision;
    trainer_config.shape.loss_chunk_tokens = loss_chunk;
    trainer_config.learning_rate = 3e-3;
    trainer_config.max_steps = 3;
    optim::Trainer trainer(*model, trainer_config);
    int cursor = 0;
    const int length = 24;
    const nn::BatchSource source = padded_label_batches(config.vocab_size(), length, cursor);
    TrainedRun trained;
    for (int step = 0; step < 3; ++step) trained.losses.push_back(trainer.train_step(source)->loss);
    trained.evaluated = trainer.evaluate({*source(), *source()}).loss; // no grad: the loss-only chunks
    for (const Tensor& parameter : model->parameters()) {
        const std::vector<float> values = cast(parameter, DType::f32).to_vector<float>();
        trained.weights.insert(trained.weights.end(), values.begin(), values.end());
    }
    return trained;
}

TEST(StreamingHeadTrainer, MatchesTheWholeLogitsBitwiseWithOneChunkAndCloselyWithSmallOnes) {
    for (const std::string model : {"tiny", "llama-tiny"}) {
        for (const Precision precision : {Precision::fp32, Precision::bf16}) {
            const std::string what = model + " " + precision_name(precision);
            const TrainedRun whole = train(model, precision, 0);
            const TrainedRun one_chunk = train(model, precision, 48);
            EXPECT_EQ(one_chunk.losses, whole.losses) << what;
            EXPECT_EQ(one_chunk.weights, whole.weights) << what;
            // Evaluation runs the loss-only path (the V real columns' GEMM) against the whole padded logits'.
            EXPECT_NEAR(one_chunk.evaluated, whole.evaluated, precision == Precision::bf16 ? 2e-3 : 1e-6) << what;
            const TrainedRun chunked = train(model, precision, 10);
            EXPECT_NEAR(chunked.evaluated, whole.evaluated, precision == Precision::bf16 ? 2e-3 : 1e-5) << what;
            for (size_t step = 0; step < whole.losses.size(); ++step)
                EXPECT_NEAR(chunked.losses[step], whole.losses[step], (precision == Precision::bf16 ? 2e-3 : 1e-5))
                    << what << " step " << step;
        }
    }
}

TEST(StreamingHeadTrainer, ACustomLossIsRefusedWithLossChunks) {
    const nn::ModelConfig config = nn::ModelConfig::named("tiny");
    const std::unique_ptr<nn::CausalLM> model = config.build(5, Device::cpu, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.loss_chunk_tokens = 16;
    optim::Trainer trainer(*model, trainer_config);
    expect_error([&] { trainer.set_loss_function([](const Tensor& logits, const nn::Batch&) {
                           return optim::LossSum{sum(logits), 1};
                       }); },
                 {"cannot run with loss_chunk_tokens 16"});
    trainer_config.shape.loss_chunk_tokens = -1;
    expect_error([&] { optim::Trainer refused(*model, trainer_config); }, {"loss_chunk_tokens"});
}

} // namespace
} // namespace engine::testing
