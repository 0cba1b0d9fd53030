#!/usr/bin/env bash
# ctest train_gpt_emulated_cuda_matches_cpu (emulated build only): train_gpt --device cuda on the emulated
# device gives the CPU's loss at every step within 1e-5 relative, with gradient accumulation, checkpointing
# and offload with prefetch on, and TF32 off (--tf32 false). usage: train_gpt_cuda_matches_cpu.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
python=$(command -v python3 || command -v /usr/bin/python3 || echo python3) # only json and sys are used
flags=(--max-steps "${TRAIN_GPT_CUDA_STEPS:-4}" --per-device-train-batch-size 2 --seq-len 32 --gradient-accumulation-steps 3
       --gradient-checkpointing
       --every-n-layers 1 --offload --prefetch)
for device in cpu cuda; do
    math=()
    [ "$device" = cuda ] && math=(--tf32 false)
    if ! "$train_gpt" --device "$device" "${math[@]}" "${flags[@]}" --log "$work/$device.jsonl" >"$work/$device.out" 2>&1; then
        echo "FAIL: train_gpt --device $device exited non-zero:"
        tail -5 "$work/$device.out"
        exit 1
    fi
done
"$python" - "$work/cpu.jsonl" "$work/cuda.jsonl" <<'PY'
import json, sys
cpu = [json.loads(line) for line in open(sys.argv[1])]
cuda = [json.loads(line) for line in open(sys.argv[2])]
assert len(cpu) == len(cuda) and cpu, f"{len(cpu)} CPU steps vs {len(cuda)} CUDA steps"
worst = 0.0
for a, b in zip(cpu, cuda):
    relative = abs(a["loss"] - b["loss"]) / abs(a["loss"])
    worst = max(worst, relative)
    print(f"step {a['step']}: cpu {a['loss']:.8f} cuda {b['loss']:.8f} relative {relative:.2e}")
    assert relative <= 1e-5, f"step {a['step']}: relative difference {relative:.2e} exceeds 1e-5"
assert cuda[-1]["peak_mib"]["pinned_host"] > 0, "offload put nothing in pinned memory on cuda"
print(f"{len(cpu)} steps, worst relative difference {worst:.2e}")
PY
