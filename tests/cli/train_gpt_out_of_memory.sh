#!/usr/bin/env bash
# ctest train_gpt_out_of_memory: an out-of-memory failure is reported against the plan and loses nothing trained.
# A run whose micro-batches differ in size (a token budget over documents of different lengths) is trained once
# freely; then again under --memory-limit one byte below the first step whose peak passes every earlier one, so
# that it fails there: the failure names the step, the phase, the category and the plan's prediction, and --out gets
# the state from before that step, from which --resume gives the free run's losses bitwise. A limit below the
# first step writes the initial state, which resumes bitwise too. usage: train_gpt_out_of_memory.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
python=/usr/bin/python3
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}
losses() { "$python" -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"; }
run=(--max-steps 6 --seed 1 --data-layout padded --eot-token 10 --max-seq-len 512 --seq-len 512
     --max-tokens-per-micro-batch 1024 --per-device-train-batch-size 8)

"$train_gpt" "${run[@]}" --log "$work/free.jsonl" >"$work/free.out" 2>&1
check "the free run trains" $? "$(tail -3 "$work/free.out")"
limit=$("$python" - "$work/free.jsonl" <<'PY'
import json, sys
peaks = [json.loads(line)["peak_total_bytes"] for line in open(sys.argv[1])]
for step in range(1, len(peaks)):
    if peaks[step] > max(peaks[:step]):
        print(step + 1, peaks[step] - 1)
        break
PY
)
read -r failing_step limit_bytes <<<"$limit"
test -n "$limit_bytes"
check "a later step peaks above every earlier one (the data's sizes differ)" $? "$(cat "$work/free.jsonl")"

"$train_gpt" "${run[@]}" --memory-limit "${limit_bytes}B" --out "$work/state" --log "$work/limited.jsonl" \
  >"$work/limited.out" 2>&1
code=$?
test $code -eq 1
check "the limited run stops with exit 1" $? "exit $code: $(tail -3 "$work/limited.out")"
grep -q "train_gpt: out of memory in step $failing_step, \(forward\|backward\).* more for .* past --memory-limit .* The plan predicted the step's peak at .*, above what the device gave" "$work/limited.out"
check "the failure names the step, the phase, the category and the plan's prediction" $? "$(grep -i memory "$work/limited.out")"
grep -q "saved the training state before step $failing_step to $work/state/" "$work/limited.out"
check "the state from before the failed step is written" $? "$(tail -4 "$work/limited.out")"
test "$(wc -l <"$work/limited.jsonl")" -eq $((failing_step - 1)) || [ "$failing_step" -eq 2 ]
check "the steps before it trained" $? "$(cat "$work/limited.jsonl")"
"$train_gpt" "${run[@]}" --resume "$work/state" --log "$work/resumed.jsonl" >"$work/resumed.out" 2>&1
check "--resume continues" $? "$(tail -3 "$work/resumed.out")"
expected=$("$python" -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in list(open(sys.argv[1]))[int(sys.argv[2]) - 1:]))' "$work/free.jsonl" "$failing_step")
test "$(losses "$work/resumed.jsonl")" = "$expected"
check "the resumed run's losses are the free run's, bitwise" $? "$(losses "$work/resumed.jsonl") vs $expected"

# Below the first step: the initial state is written, and resumes bitwise.
"$train_gpt" "${run[@]}" --memory-limit 4MiB --out "$work/early" >"$work/early.out" 2>&1
test $? -eq 1 && grep -q "out of memory in step 1" "$work/early.out" && grep -q "saved the training state before step 1" "$work/early.out"
check "a limit below the first step writes the initial state" $? "$(tail -4 "$work/early.out")"
"$train_gpt" "${run[@]}" --resume "$work/early" --log "$work/early.jsonl" >"$work/early_resumed.out" 2>&1
test "$(losses "$work/early.jsonl")" = "$(losses "$work/free.jsonl")"
check "and --resume from it gives the free run's losses, bitwise" $? "$(losses "$work/early.jsonl")"
# No --out: the failure says nothing was written.
"$train_gpt" "${run[@]}" --memory-limit 4MiB >"$work/nowhere.out" 2>&1
test $? -eq 1 && grep -q "no --out DIR: the training state was not written" "$work/nowhere.out"
check "without --out the failure says the state was not written" $? "$(tail -3 "$work/nowhere.out")"

# The data cursor counts the saved run's windows: a resume with another token budget is refused.
"$train_gpt" "${run[@]/1024/2048}" --resume "$work/state" >"$work/other_budget.out" 2>&1
test $? -eq 2 && grep -q "was saved with --max-tokens-per-micro-batch 1024 and this run has 2048" "$work/other_budget.out"
check "a resume with another token budget is refused" $? "$(tail -2 "$work/other_budget.out")"

# Below the model state itself: refused before training, naming the flag.
"$train_gpt" "${run[@]}" --memory-limit 1MiB >"$work/tiny.out" 2>&1
test $? -eq 2 && grep -q "error: --memory-limit: below what the model, its gradients and its optimizer state hold" "$work/tiny.out"
check "a limit below the model state is refused before training, naming --memory-limit" $? "$(cat "$work/tiny.out")"

echo "$((total - failures))/$total checks passed"
[ "$failures" -eq 0 ]
