#!/usr/bin/env bash
# ctest train_gpt_emulated_cuda_matches_cpu (emulated build only): train_gpt --device cuda on the emulated
# device gives the CPU's loss at every step within 1e-5 relative, with gradient accumulation, checkpointing
# and offload with prefetch on, and TF32 off (--tf32 false); and with --precision bf16, CUDA's bf16 kernels
# against the CPU's within the bf16 bound below; the --eval-data losses (eval mode under NoGradGuard, through
# the checkpointed blocks) within the same bounds. Both architectures: GPT-2 (tiny) and Llama (llama-tiny:
# RoPE, grouped-query attention, SwiGLU, RMSNorm). usage: train_gpt_cuda_matches_cpu.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
python=$(command -v python3 || command -v /usr/bin/python3 || echo python3) # only json and sys are used
# Held-out text: 620 bytes, 19 windows of 32, 9 batches of 2.
for index in $(seq 20); do printf 'the %02d cat sat on the warm mat.' "$index"; done >"$work/held_out.txt"
flags=(--eval-data "$work/held_out.txt" --eval-steps 3 --eval-every 2 --max-steps "${TRAIN_GPT_CUDA_STEPS:-4}" --per-device-train-batch-size 2 --seq-len 32 --gradient-accumulation-steps 3
       --gradient-checkpointing
       --every-n-layers 1 --offload --prefetch)
for model in tiny llama-tiny; do
for precision in fp32 bf16; do
for device in cpu cuda; do
    math=()
    [ "$device" = cuda ] && [ "$precision" = fp32 ] && math=(--tf32 false)
    if ! "$train_gpt" --model "$model" --device "$device" --precision "$precision" "${math[@]}" "${flags[@]}" \
        --log "$work/$model-$device-$precision.jsonl" >"$work/$model-$device-$precision.out" 2>&1; then
        echo "FAIL: train_gpt --model $model --device $device --precision $precision exited non-zero:"
        tail -5 "$work/$model-$device-$precision.out"
        exit 1
    fi
done
# fp32: the two devices differ only in summation order, ~1e-7 per op, so 1e-5 on the loss. bf16: an f32 value
# whose last bits differ between the devices' summation orders can round to the neighbouring bf16 value, a
# relative step of u = 2^-8 on that element; the loss is a mean over 2·32·3 tokens of such elements' effects,
# so it moves by a small fraction of u: 2^-10 (1e-3) bounds it and is far below what a wrong kernel gives.
tolerance=1e-5
[ "$precision" = bf16 ] && tolerance=9.765625e-4
"$python" - "$work/$model-cpu-$precision.jsonl" "$work/$model-cuda-$precision.jsonl" "$tolerance" <<'PY' || exit 1
import json, sys
tolerance = float(sys.argv[3])
cpu = [json.loads(line) for line in open(sys.argv[1])]
cuda = [json.loads(line) for line in open(sys.argv[2])]
assert len(cpu) == len(cuda) and cpu, f"{len(cpu)} CPU steps vs {len(cuda)} CUDA steps"
worst = 0.0
for a, b in zip(cpu, cuda):
    relative = abs(a["loss"] - b["loss"]) / abs(a["loss"])
    worst = max(worst, relative)
    print(f"step {a['step']}: cpu {a['loss']:.8f} cuda {b['loss']:.8f} relative {relative:.2e}")
    assert relative <= tolerance, f"step {a['step']}: relative difference {relative:.2e} exceeds {tolerance:.2e}"
    assert ("eval_loss" in a) == ("eval_loss" in b) == (a["step"] % 2 == 0), f"step {a['step']}: eval_loss"
    if "eval_loss" in a:
        relative = abs(a["eval_loss"] - b["eval_loss"]) / abs(a["eval_loss"])
        worst = max(worst, relative)
        print(f"  eval: cpu {a['eval_loss']:.8f} cuda {b['eval_loss']:.8f} relative {relative:.2e}")
        assert relative <= tolerance, f"step {a['step']}: eval relative difference {relative:.2e} exceeds {tolerance:.2e}"
assert cuda[-1]["peak_mib"]["pinned_host"] > 0, "offload put nothing in pinned memory on cuda"
print(f"{sys.argv[1]}: {len(cpu)} steps, worst relative difference {worst:.2e}")
PY
done
done
