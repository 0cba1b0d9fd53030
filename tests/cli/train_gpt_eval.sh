#!/usr/bin/env bash
# ctest train_gpt_eval: --eval-data FILE --eval-steps K --eval-every M. The training losses are bitwise those of
# a run without it (dropout on, so a stray RNG draw would show), also across --out/--resume; eval lines and
# eval_loss records come at steps M, 2M, ... and the last; the eval loss equals an independent oracle, the
# step-1 training loss of a second run that starts from the saved weights, trains on the eval file with
# dropout 0 and sees all its windows in one step. usage: train_gpt_eval.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
python=$(command -v python3 || command -v /usr/bin/python3 || echo python3) # only json, struct and sys are used
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}

# The eval file: an llm.c token shard (docs/FORMATS.md) of English bytes, 8 windows of 64 tokens and 10 more
# that no full window holds (dropped, as the training loader drops them).
"$python" - "$work/eval.bin" <<'PY'
import struct, sys
text = ("the cat sat on the mat and the dog ran to the park. a bird sang in the tall tree while we read. " * 8).encode()
tokens = list(text[:8 * 64 + 10])
header = struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253))
open(sys.argv[1], "wb").write(header + struct.pack(f"<{len(tokens)}H", *tokens))
PY
check "eval shard written" $? "python failed"

# 1. With and without --eval-data: the same training, bitwise; evaluations at steps 4 and 6 (the last).
common=(--model tiny --dropout 0.1 --lr-scheduler-type constant --per-device-train-batch-size 4
        --gradient-accumulation-steps 2 --max-steps 6)
evaluation=(--eval-data "$work/eval.bin" --eval-steps 2 --eval-every 4)
"$train_gpt" "${common[@]}" --log "$work/plain.jsonl" >"$work/plain.out" 2>&1
check "run without --eval-data" $? "$(tail -2 "$work/plain.out")"
"$train_gpt" "${common[@]}" "${evaluation[@]}" --log "$work/eval.jsonl" --save "$work/final.safetensors" \
  >"$work/eval.out" 2>&1
check "run with --eval-data" $? "$(tail -2 "$work/eval.out")"
! grep -q "^eval step" "$work/plain.out"
check "no eval lines without --eval-data" $? "$(grep '^eval step' "$work/plain.out")"
[ "$(grep '^eval step' "$work/eval.out" | sed 's/:.*//')" = "$(printf 'eval step 4\neval step 6')" ] &&
  grep -q "^eval step 6: loss [0-9.]* (2 batches, 504 tokens)$" "$work/eval.out"
check "eval lines at steps 4 and 6, 2 batches of 4 x 63 targets" $? "$(grep '^eval step' "$work/eval.out")"
"$python" - "$work/plain.jsonl" "$work/eval.jsonl" "$work/eval.out" <<'PY'
import json, re, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
evaluated = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in plain] == [r["step"] for r in evaluated] == [1, 2, 3, 4, 5, 6]
for a, b in zip(plain, evaluated):
    for key in ("loss", "grad_norm", "lr", "num_items_in_batch"):
        assert a[key] == b[key], f"step {a['step']}: {key} {b[key]!r} with eval != {a[key]!r} without"
    assert "eval_loss" not in a
    assert ("eval_loss" in b) == (b["step"] in (4, 6)), f"step {b['step']}: eval_loss {'eval_loss' in b}"
printed = dict(re.findall(r"^eval step (\d+): loss (\S+) ", open(sys.argv[3]).read(), re.M))
for record in evaluated:
    if "eval_loss" in record:
        assert record["eval_batches"] == 2 and record["eval_num_items"] == 504, record
        assert printed[str(record["step"])] == f"{record['eval_loss']:.4f}", (printed, record["eval_loss"])
print("training bitwise equal; eval_loss at", [r["step"] for r in evaluated if "eval_loss" in r])
PY
check "eval changes no training figure and logs eval_loss on steps 4 and 6" $? "see above"

# 2. An evaluated step is logged even between --logging-steps.
"$train_gpt" "${common[@]}" "${evaluation[@]}" --logging-steps 5 --log "$work/sparse.jsonl" >"$work/sparse.out" 2>&1
check "run with --logging-steps 5" $? "$(tail -2 "$work/sparse.out")"
"$python" - "$work/sparse.jsonl" "$work/eval.jsonl" <<'PY'
import json, sys
sparse = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
full = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert sorted(sparse) == [1, 4, 5, 6], sorted(sparse)
for step in (4, 6):
    assert sparse[step]["eval_loss"] == full[step]["eval_loss"], step
PY
check "evaluated steps are logged and evaluate the same" $? "see above"

# 3. Saved at step 3 and resumed to 6, with evaluation: bitwise the straight run's losses and eval losses.
"$train_gpt" "${common[@]}" "${evaluation[@]}" --max-steps 3 --out "$work/state" --save-every 3 >"$work/first.out" 2>&1
check "first half saves" $? "$(tail -2 "$work/first.out")"
"$train_gpt" "${common[@]}" "${evaluation[@]}" --resume "$work/state" --log "$work/resumed.jsonl" >"$work/resumed.out" 2>&1
check "second half resumes" $? "$(tail -2 "$work/resumed.out")"
"$python" - "$work/eval.jsonl" "$work/resumed.jsonl" <<'PY'
import json, sys
straight = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
resumed = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert sorted(resumed) == [4, 5, 6], sorted(resumed)
for step, record in resumed.items():
    for key in ("loss", "grad_norm", "eval_loss"):
        assert record.get(key) == straight[step].get(key), f"step {step}: {key} {record.get(key)!r} != {straight[step].get(key)!r}"
print("resumed losses and eval losses equal the straight run's bitwise")
PY
check "resume with evaluation is bitwise the straight run" $? "see above"

# 4. The oracle: batches of 1, all 8 windows per evaluation. The second run starts from the weights evaluated
#    at the last step and trains one step of 8 micro-batches of 1 window on the eval file (shuffled: each
#    window once) with dropout 0, so its step-1 loss is the same 8 per-window loss sums over the same 504
#    targets, computed by the training path instead of evaluate. Each sum is a float near 300; 8 of them add
#    exactly in double in any order, so the two figures must be bitwise equal.
"$train_gpt" --model tiny --dropout 0.1 --per-device-train-batch-size 1 --gradient-accumulation-steps 2 --max-steps 3 \
  --eval-data "$work/eval.bin" --eval-steps 8 --eval-every 100 --log "$work/ones.jsonl" \
  --save "$work/ones.safetensors" >"$work/ones.out" 2>&1
check "run with batches of 1 evaluates at its last step" $? "$(tail -2 "$work/ones.out")"
"$train_gpt" --model tiny --dropout 0 --init "$work/ones.safetensors" --data "$work/eval.bin" \
  --per-device-train-batch-size 1 --gradient-accumulation-steps 8 --max-steps 1 --log "$work/oracle.jsonl" \
  >"$work/oracle.out" 2>&1
check "oracle run" $? "$(tail -2 "$work/oracle.out")"
"$python" - "$work/ones.jsonl" "$work/oracle.jsonl" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in records if "eval_loss" in r] == [3], "one evaluation, at the last step"
evaluated = records[-1]
oracle = json.loads(open(sys.argv[2]).readline())
assert oracle["num_items_in_batch"] == evaluated["eval_num_items"] == 504, (oracle["num_items_in_batch"], evaluated)
assert oracle["loss"] == evaluated["eval_loss"], f"eval_loss {evaluated['eval_loss']!r} != oracle {oracle['loss']!r}"
print(f"eval_loss {evaluated['eval_loss']!r} == training-path loss at the same weights")
PY
check "eval loss equals the training path's loss at the same weights" $? "see above"

# 5. The default --eval-steps (20) is lowered to the batches a smaller file holds (8 windows: one of 8).
"$train_gpt" --model tiny --max-steps 2 --eval-data "$work/eval.bin" >"$work/default.out" 2>&1
check "default --eval-steps" $? "$(tail -2 "$work/default.out")"
[ "$(grep -c '^eval step' "$work/default.out")" -eq 1 ] && grep -q "^eval step 2: .* (1 batches, 504 tokens)$" "$work/default.out"
check "default: one evaluation at the last step over the file's one batch" $? "$(grep '^eval step' "$work/default.out")"

# 6. The evaluation phase's peak: --plan predicts it (planner::predict_evaluation_memory) and each evaluation of the
# runs above logs it (eval_peak_total_bytes): equal to the byte, for the full run of 1. and for a QLoRA run of the
# tiny Llama with checkpointing, loss chunks and MLP tiles.
eval_peak_matches() { # NAME LOG FLAGS...
  local name=$1 log=$2
  shift 2
  local predicted
  predicted=$("$train_gpt" "$@" --plan 2>&1 | sed -n 's/^evaluation (.*): peak [^(]*(\([0-9]*\) B).*/\1/p')
  local measured
  measured=$(sed -n 's/.*"eval_peak_total_bytes":\([0-9]*\).*/\1/p' "$log" | sort -u)
  [ -n "$predicted" ] && [ "$measured" = "$predicted" ]
  local status=$? # before the check's arguments expand: the command substitution in its name would reset $? to 0
  check "$name: the evaluation's peak, predicted $predicted B, measured $(echo "$measured" | tr '\n' ' ')" $status \
    "--plan and the log differ"
}
eval_peak_matches "full run" "$work/eval.jsonl" "${common[@]}" "${evaluation[@]}"
qlora=(--model llama-tiny --lora-r 4 --lora-target-modules all-linear --load-in-4bit --precision bf16
       --gradient-checkpointing --loss-chunk-tokens 100 --mlp-tile-tokens 32 --per-device-train-batch-size 4
       --max-steps 4 --eval-data "$work/eval.bin" --eval-steps 2 --eval-every 2)
"$train_gpt" "${qlora[@]}" --log "$work/qlora.jsonl" >"$work/qlora.out" 2>&1
check "QLoRA run with --eval-data" $? "$(tail -2 "$work/qlora.out")"
eval_peak_matches "QLoRA run" "$work/qlora.jsonl" "${qlora[@]}"

echo "$((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
