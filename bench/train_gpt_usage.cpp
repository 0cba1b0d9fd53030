// train_gpt --help: every flag, its values and its default, grouped as docs/TRAINING.md explains them.
#include "train_gpt_options.h"

namespace train_gpt {

std::string usage() {
    return R"(usage: train_gpt [flags]     (no flags: the tiny GPT on the built-in corpus, on the CPU)

model:
  --model NAME                   GPT-2: tiny | small | gpt2-124M | gpt2-350M | gpt2-774M | gpt2-1558M;
                                 Llama: llama-tiny | smollm-135m (default tiny)
  --vocab-size N --max-seq-len N --n-layer N --n-head N --n-embd N   override the named size
  --n-kv-head N --intermediate-size N    Llama only: key/value heads (grouped-query attention), MLP width
  --dropout P                    GPT-2 only (default 0)
  --seq-len N                    tokens per sequence (default: the model's max)
  --init DIR|FILE.safetensors    start from these weights. DIR: a Hugging Face model directory (config.json with
                                 model.safetensors or sharded files): its config decides the architecture and
                                 every size, so --model and the size flags are refused. FILE: Hugging Face
                                 names of the --model architecture
  --save DIR|FILE.safetensors    write the trained weights (the f32 masters; see --save-dtype). A path ending in
                                 .safetensors: that one file. Any other path (model.bin included, which before
                                 Llama support wrote a file) is a directory transformers' from_pretrained loads:
                                 config.json, model.safetensors, and --init DIR's tokenizer files
  --save-dtype fp32|bf16         the dtype --save writes (default fp32; bf16 rounds to nearest even)
data:
  --data FILE                    llm.c token shard or any file as bytes (default: built-in corpus)
  --data-layout packed|padded|packed-documents
                                 packed: windows of --seq-len tokens (default); padded: one document per
                                 sequence, split at --eot-token, truncated or padded (labels -100);
                                 packed-documents: those documents packed back to back into each sequence,
                                 positions restarting and attention kept inside each document
  --max-tokens-per-micro-batch N a token budget per micro-batch: rows are taken while rows x the longest
                                 stays within N (and within --per-device-train-batch-size), cut to the
                                 longest (padded: its longest document; packed-documents: its fullest row);
                                 at least --seq-len; --plan plans for the worst micro-batch; one rank
  --eot-token N                  end of text for padded and packed-documents (default: --init DIR's
                                 eos_token_id; else 50256 if the vocabulary has it, else 10, '\n')
data parallelism (mpirun -np N train_gpt ...; docs/DISTRIBUTED.md):
  --communicator auto|none|mpi|nccl   auto: nccl on CUDA, mpi on the CPU when launched with several ranks
  --check-replicas[=true|false]  after every step, check every rank holds bitwise the same weights and moments
  --zero-stage 0|1|2|3           1: each rank keeps the optimizer state of 1/N of the parameters (ZeRO-1);
                                 2: and their summed gradients (ZeRO-2; needs --gradient-checkpointing);
                                 3: and their f32 masters, the checkpointed layers' weights gathered from the ranks
                                 for each use (ZeRO-3; needs --gradient-checkpointing; with --offload-optimizer
                                 cpu the masters' parts on the host, --offload-gradients stream, no
                                 --offload-parameters)
  --world-size N                 with --plan: plan for N data-parallel ranks without launching them (default: the
                                 launcher's, 1 without one)
  --offload-optimizer none|cpu   cpu: the f32 masters, their gradients and the optimizer state live in host
                                 memory and the update runs there; the device keeps the working weights and the
                                 step's gradients (DeepSpeed's offload_optimizer; needs --device cuda)
  --offload-gradients window|stream   with --offload-optimizer cpu, where the step's gradients are summed.
                                 window (default): on the device, copied down once per step. stream: on the host;
                                 each checkpointed segment's gradients exist on the device only during its
                                 backward (needs --gradient-checkpointing)
  --loss-chunk-tokens N|off|auto the streaming LM head: the loss and its gradients over chunks of N of the
                                 micro-batch's B x T tokens, so that the (B,T,V) logits never exist (off: the
                                 whole logits; auto (default): the head's buffers (a chunk's logits, d(hidden),
                                 the losses) within 256 MiB: all tokens when the whole logits fit, else the
                                 largest multiple of 64 that does; under --max-memory the planner's choice)
  --mlp-tile-tokens N|off|auto   the sequence-tiled MLP: every layer's MLP over tiles of N of the micro-batch's
                                 B x T tokens, so that its intermediates exist one tile at a time, for one more
                                 MLP forward in backward (off: the whole MLP; auto (default): off while a layer's
                                 MLP intermediates take at most 256 MiB, else the largest multiple of 64 tokens
                                 whose intermediates take at most 64 MiB; under --max-memory the planner's choice,
                                 and a fixed N is cut to each plan's micro-batch)
  --offload-parameters none|cpu  with --offload-optimizer cpu and --gradient-checkpointing, cpu: the checkpointed
                                 layers' working weights live in host memory too and come to the device for each
                                 segment's forward and again for its recompute and backward, one segment at a time
                                 (DeepSpeed's offload_param); the embeddings and the head stay
LoRA (PEFT's names; docs/TRAINING.md, "LoRA"): the model frozen, adapters on the target layers trained
  --lora-r N                     LoRA of rank N on --lora-target-modules
  --lora-alpha X                 scaling X / r (default 8, PEFT's)
  --lora-dropout P               dropout on the adapters' input (default 0)
  --lora-target-modules A,B,...  layer names or their last parts (default PEFT's: q_proj,v_proj for Llama,
                                 c_attn for GPT-2); all-linear: every linear layer but the head
  --init-adapter DIR             start from a PEFT adapter directory (its config sets r, alpha, dropout, targets)
  --save-adapter DIR             after training, write the adapters as PEFT's adapter_config.json and
                                 adapter_model.safetensors (PeftModel.from_pretrained loads them)
  --merge DIR                    after training, write a Hugging Face model directory with the adapters merged
                                 (with --load-in-4bit: into the dense base, --init's weights)
  --load-in-4bit                 QLoRA: the base's linear layers (not the head) frozen in NF4 with double-
                                 quantised scales, bitsandbytes' layout (0.5 bytes a weight), dequantised for
                                 each use in the compute dtype; needs --lora-r or --init-adapter
training (Hugging Face names; each flag sets the TrainerConfig field of its name, whose validate() is the one
check of the values; the defaults shown are train_gpt's, for a quick run of the tiny model; the library's
TrainerConfig{} differs in: gradient_accumulation_steps 1, learning_rate 1e-3, weight_decay 0, adam_beta2 0.999,
lr_scheduler_type constant, warmup_steps 0, min_lr_ratio 0, max_steps 100):
  --per-device-train-batch-size N   sequences per micro-batch (default 8)
  --gradient-accumulation-steps N   micro-batches per optimizer step (default 2)
  --learning-rate X (3e-3)  --weight-decay X (0.1, 2-D weights only)
  --adam-beta1 X (0.9)  --adam-beta2 X (0.95)  --adam-epsilon X (1e-8)
  --max-grad-norm X (1.0; 0 = off)  --optimizer adamw|sgd  --sgd-momentum X (0.9)
  --lr-scheduler-type constant|cosine (cosine)  --warmup-steps N (3)  --min-lr-ratio X (0.1)
  --max-steps N (40)  --seed N (42)  --logging-steps N (1)
  --loss-normalization tokens|mean  tokens: sum of token losses / targets in the whole step (default)
memory:
  --gradient-checkpointing[=true|false]  --every-n-layers N (1)  --segment-size N|sqrt (1; 0 = sqrt)
  --offload[=true|false]         checkpointed segments' inputs in pinned host memory; needs --gradient-checkpointing
  --prefetch[=true|false]        with --offload: copy the next segment back ahead of its recompute (CUDA copy stream)
  --skip-nonfinite[=true|false]  skip (and count) a step whose loss or grad norm is NaN/Inf; default: stop with an error
  --batch-invariant[=true|false] the same bits whatever the micro-batch, accumulation and ranks (docs/TRAINING.md): each
                                 micro-batch runs as chunks of one sequence, their gradients summed exactly
  --batch-invariant-chunk C      the same with chunks of C sequences (C divides --per-device-train-batch-size)
  --plan                         print the predicted memory per category for these flags and exit (with LoRA: the
                                 model state beside a full fine-tune's first; with --eval-data: the evaluation's peak)
  --max-memory SIZE|auto         plan for a memory budget: bytes or a number with KiB, MiB, GiB (3.5MiB, 16GiB);
                                 auto: the device's free memory (CPU: MemAvailable) minus 10%. The planner picks
                                 micro-batch, accumulation, checkpointing and offload (and precision with
                                 --precision auto, ZeRO stage with several ranks): the least predicted time that
                                 fits. With --plan it prints the plan and exits; no plan fits: exit 2
  --global-batch-size S          with --max-memory: sequences per optimizer step over all ranks (default b x N)
  --memory-limit SIZE            the device's account refuses allocations past SIZE, as a device of that size
                                 would (out of memory: the phase, the category and the plan's prediction named,
                                 and with --out the training state written before the failed step)
  --max-host-memory SIZE|auto    host memory one rank's offloaded model state may take: the planner's host budget,
                                 and checked against --offload-optimizer cpu's prediction before anything is built
                                 (default auto: MemAvailable minus 10%; ranks sharing a host share it: divide it)
  --max-pinned-memory SIZE       of it, what may be pinned (page-locked) on a device: offloaded segment inputs,
                                 parked weights, staged ids, the save's block: the planner's pinned budget, and
                                 checked against the run's prediction before anything is built (default: none)
  --device auto|cpu|cuda         (auto: cuda when a device is present; with --plan, cuda plans for a CUDA device
                                 even on a machine without one)
  --tf32 true|false              CUDA GEMMs and attention on TF32 tensor cores (default true on CUDA; false:
                                 full fp32, to compare with the CPU)
  --precision fp32|bf16|auto     bf16: mixed precision (Hugging Face's bf16): bf16 activations and working copy
                                 of the weights, f32 master weights and gradient buffers (default fp32);
                                 auto (with --max-memory): the planner may choose bf16
validation:
  --eval-data FILE               held-out tokens (llm.c shard or bytes, as --data): every --eval-every steps
                                 and after the last, print and log (eval_loss) the token mean of the loss over
                                 its first --eval-steps batches, read in file order from its start each time,
                                 in eval mode (no dropout); training is bitwise the same with or without it
  --eval-steps K                 batches per evaluation, each --per-device-train-batch-size sequences per rank
                                 (default 20, or every batch of a smaller file)
  --eval-every M                 optimizer steps between evaluations (default 10)
output:
  --log FILE                     JSON lines, one per logged step, same fields as the printed line (and
                                 eval_loss, eval_batches, eval_num_items on an evaluated step, always logged)
  --out DIR --save-every K       training state (weights, optimizer, RNG, data cursor, config) every K steps
                                 and at the end; DIR keeps the newest two (docs/RELIABILITY.md)
  --resume DIR                   continue from the newest valid training state in DIR
  --memory-timeline FILE         record every allocation and free of one step (category, size, op, phase) in
                                 Chrome's trace format (Perfetto opens it); scripts/plot_memory.py FILE draws it
  --memory-timeline-step K       which step (default: the run's first)
  --profile[=true|false]         time every CPU kernel per op and phase (forward, backward, grad_norm,
                                 optimizer) over the steps after the first two; print the table and the GEMM
                                 share after training, and log it under "profile" on the last --log line
  --help
)";
}

} // namespace train_gpt
