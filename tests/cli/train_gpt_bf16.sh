#!/usr/bin/env bash
# ctest train_gpt_bf16: --precision bf16 against fp32 as a user runs them. The default run (tiny, 40 steps)
# and 300 steps of the small model: bf16's loss stays within 2% of fp32's at every logged step after step 20.
# Also: the bf16 log reports smaller activation peaks, --plan names the precision, and --save writes the f32
# masters unless --save-dtype bf16 asks for BF16. usage: train_gpt_bf16.sh TRAIN_GPT WORK_DIR
# (The plot docs/bf16_loss.png is drawn from these logs by scripts/plot_log.py; see docs/TRAINING.md.)
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
python=$(command -v python3 || echo python3) # only json and sys are used
check() { # NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}

compare() { # FP32_LOG BF16_LOG STEPS
  "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
fp32 = [json.loads(line) for line in open(sys.argv[1])]
bf16 = [json.loads(line) for line in open(sys.argv[2])]
steps = int(sys.argv[3])
assert len(fp32) == steps and len(bf16) == steps, f"{len(fp32)} and {len(bf16)} lines for {steps} steps"
worst, worst_step = 0.0, 0
for a, b in zip(fp32, bf16):
    assert a["step"] == b["step"]
    if a["step"] <= 20:
        continue
    relative = abs(b["loss"] / a["loss"] - 1)
    if relative > worst:
        worst, worst_step = relative, a["step"]
    assert relative <= 0.02, f"step {a['step']}: bf16 loss {b['loss']:.5f} vs fp32 {a['loss']:.5f} ({100*relative:.2f}%)"
activation_ratio = bf16[-1]["peak_mib"]["activations"] / fp32[-1]["peak_mib"]["activations"]
assert activation_ratio <= 0.55, f"bf16 activation peak is {activation_ratio:.3f} of fp32's"
print(f"largest relative loss difference after step 20: {100*worst:.3f}% at step {worst_step}; "
      f"final losses fp32 {fp32[-1]['loss']:.4f} bf16 {bf16[-1]['loss']:.4f}; activation peak ratio {activation_ratio:.3f}")
PY
}

# 1. The default run.
"$train_gpt" --log "$work/default_fp32.jsonl" >"$work/default_fp32.out" 2>&1
check "default run, fp32" $? "$(tail -3 "$work/default_fp32.out")"
"$train_gpt" --precision bf16 --log "$work/default_bf16.jsonl" >"$work/default_bf16.out" 2>&1
check "default run, bf16" $? "$(tail -3 "$work/default_bf16.out")"
grep -q "bf16 mixed precision" "$work/default_bf16.out"
check "bf16 run says so" $? "$(head -4 "$work/default_bf16.out")"
compare "$work/default_fp32.jsonl" "$work/default_bf16.jsonl" 40
check "default run: bf16 within 2% of fp32 after step 20" $? "see above"

# 2. 300 steps of the small model (ENGINE_SKIP_LONG_BF16=1 leaves it out of a quick local run). At lr 3e-4:
#    at the default 3e-3 the small model memorises the built-in corpus and its trajectory is chaotic, so that
#    fp32 against fp32 with only the summation order changed (micro-batch 4 x 4 instead of 8 x 2) already
#    differs by 7.4% at some step, and bf16 by 19%; at 3e-4 that control differs by 5e-5% (docs/PERF.md).
if [ "${ENGINE_SKIP_LONG_BF16:-0}" != 1 ]; then
  small=(--model small --max-steps 300 --seq-len 64 --learning-rate 3e-4 --warmup-steps 10 --logging-steps 1)
  "$train_gpt" "${small[@]}" --log "$work/small_fp32.jsonl" >"$work/small_fp32.out" 2>&1
  check "small model 300 steps, fp32" $? "$(tail -3 "$work/small_fp32.out")"
  "$train_gpt" "${small[@]}" --precision bf16 --log "$work/small_bf16.jsonl" >"$work/small_bf16.out" 2>&1
  check "small model 300 steps, bf16" $? "$(tail -3 "$work/small_bf16.out")"
  compare "$work/small_fp32.jsonl" "$work/small_bf16.jsonl" 300
  check "small model: bf16 within 2% of fp32 after step 20" $? "see above"
fi

# 3. --plan knows the precision.
"$train_gpt" --precision bf16 --plan >"$work/plan.out" 2>&1
grep -q "bf16 mixed precision" "$work/plan.out" && grep -q "f32 masters" "$work/plan.out"
check "--plan --precision bf16 predicts masters and working copies" $? "$(head -8 "$work/plan.out")"

# 4. --save writes the f32 masters, or BF16 with --save-dtype bf16 (the header's dtype field).
"$train_gpt" --precision bf16 --max-steps 2 --save "$work/masters.safetensors" >/dev/null 2>&1 &&
  "$train_gpt" --precision bf16 --max-steps 2 --save "$work/rounded.safetensors" --save-dtype bf16 >/dev/null 2>&1
check "bf16 runs save" $? "see $work"
"$python" - "$work/masters.safetensors" "$work/rounded.safetensors" <<'PY'
import json, struct, sys
def dtypes(path):
    with open(path, "rb") as file:
        length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(length))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
assert dtypes(sys.argv[1]) == {"F32"}, dtypes(sys.argv[1])
assert dtypes(sys.argv[2]) == {"BF16"}, dtypes(sys.argv[2])
PY
check "--save writes F32 masters, --save-dtype bf16 writes BF16" $? "see above"
"$train_gpt" --precision bf16 --max-steps 3 --init "$work/rounded.safetensors" >"$work/init_bf16.out" 2>&1
check "a BF16 file initialises a bf16 run" $? "$(tail -3 "$work/init_bf16.out")"

# 5. Bitwise resume in bf16 (checkpointing and offload on): 3 steps, save, resume to 6 equals 6 straight steps.
#    The state holds the f32 masters; the resumed run rounds them into its working copies again.
resume=(--precision bf16 --lr-scheduler-type constant --gradient-checkpointing --offload)
"$train_gpt" "${resume[@]}" --max-steps 6 --log "$work/straight.jsonl" >/dev/null 2>&1 &&
  "$train_gpt" "${resume[@]}" --max-steps 3 --out "$work/state" --save-every 3 >/dev/null 2>&1 &&
  "$train_gpt" "${resume[@]}" --max-steps 6 --resume "$work/state" --log "$work/resumed.jsonl" >/dev/null 2>&1
check "bf16 runs save and resume" $? "see $work"
"$python" - "$work/straight.jsonl" "$work/resumed.jsonl" <<'PY'
import json, sys
straight = [json.loads(line)["loss"] for line in open(sys.argv[1])]
resumed = [json.loads(line)["loss"] for line in open(sys.argv[2])]
assert straight[3:] == resumed[-3:], f"straight {straight[3:]} resumed {resumed[-3:]}"
PY
check "bf16 resume is bitwise the straight run" $? "see above"

if [ "$failures" -ne 0 ]; then
  echo "train_gpt_bf16: $failures check(s) failed"
  exit 1
fi
echo "train_gpt_bf16: all checks passed"
