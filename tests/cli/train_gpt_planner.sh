#!/usr/bin/env bash
# ctest train_gpt_planner: --max-memory end to end. Bad planner flags and a budget no plan fits exit 2 with one
# line (the infeasible one naming the smallest peak and its flags) and print nothing; a feasible budget prints
# the chosen plan and trains with a measured peak equal to the predicted one, to the byte, within the budget;
# --plan prints and exits. usage: train_gpt_planner.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_usage FLAG ARGS...: exit 2, one stderr line naming FLAG, nothing on stdout.
expect_usage() {
  local flag=$1
  shift
  "$train_gpt" "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  if [ "$rc" -ne 2 ] || [ "$(wc -l <"$work/stderr")" -ne 1 ] || ! grep -q -- "$flag" "$work/stderr" || [ -s "$work/stdout" ]; then
    fail "train_gpt $* -> exit $rc: $(head -c 300 "$work/stderr")"
  else
    echo "ok: train_gpt $* -> $(cat "$work/stderr")"
  fi
}

expect_usage --max-memory --max-memory 12MB
expect_usage --max-memory --max-memory 3.5
expect_usage --max-memory --max-memory lots
expect_usage --global-batch-size --global-batch-size 16
expect_usage --global-batch-size --max-memory 8MiB --global-batch-size 0
expect_usage --precision --precision auto
expect_usage --per-device-train-batch-size --max-memory 8MiB --per-device-train-batch-size 4
expect_usage --gradient-checkpointing --max-memory 8MiB --gradient-checkpointing
expect_usage --offload --max-memory 8MiB --offload

# No plan fits: the one line gives the smallest peak any plan reaches and that plan's flags.
expect_usage "smallest peak any plan reaches is" --max-memory 1MiB --global-batch-size 16
grep -q -- "--per-device-train-batch-size 1 --gradient-accumulation-steps 16 --gradient-checkpointing" "$work/stderr" ||
  fail "the infeasible line lacks the smallest plan's flags: $(cat "$work/stderr")"

# --plan: the table and the per-category report, no training.
"$train_gpt" --max-memory 2.5MiB --global-batch-size 16 --plan >"$work/plan.txt" 2>&1 || fail "--plan exited $?"
grep -q "^chosen: " "$work/plan.txt" && grep -q "why it lost" "$work/plan.txt" && ! grep -q "^step " "$work/plan.txt" ||
  fail "--plan output: $(cat "$work/plan.txt")"
"$train_gpt" --max-memory auto --global-batch-size 16 --plan >"$work/auto.txt" 2>&1 && grep -q "free minus a 10% margin" "$work/auto.txt" ||
  fail "--max-memory auto: $(cat "$work/auto.txt")"

# --plan with LoRA (and QLoRA): the model state beside a full fine-tune's, and the step's peak (planner/adapter_step.h),
# which a LoRA run then measures to the byte.
"$train_gpt" --model llama-tiny --lora-r 8 --lora-target-modules all-linear --load-in-4bit --precision bf16 --plan \
  >"$work/lora_plan.txt" 2>&1 || fail "--plan with LoRA exited $?: $(cat "$work/lora_plan.txt")"
grep -q "NF4" "$work/lora_plan.txt" && grep -q "^  total " "$work/lora_plan.txt" && grep -q "^  step peak" "$work/lora_plan.txt" ||
  fail "--plan with LoRA: $(cat "$work/lora_plan.txt")"
lora_flags="--model llama-tiny --lora-r 8 --lora-target-modules all-linear --load-in-4bit --precision bf16 --gradient-checkpointing --loss-chunk-tokens 100"
# shellcheck disable=SC2086
"$train_gpt" $lora_flags --plan >"$work/lora_plan.txt" 2>&1 || fail "--plan with QLoRA exited $?"
lora_predicted=$(sed -n 's/^  step peak .*as on the CPU: \([0-9]*\) B).*/\1/p' "$work/lora_plan.txt")
# shellcheck disable=SC2086
"$train_gpt" $lora_flags --max-steps 2 --log "$work/lora_log.jsonl" >"$work/lora_run.txt" 2>&1 ||
  fail "the QLoRA run exited $?: $(tail -3 "$work/lora_run.txt")"
for measured in $(sed -n 's/.*"peak_total_bytes":\([0-9]*\).*/\1/p' "$work/lora_log.jsonl"); do
  [ "$measured" = "$lora_predicted" ] || fail "QLoRA: measured peak $measured B, --plan predicted $lora_predicted B"
done
echo "QLoRA run: --plan predicted $lora_predicted B, measured $(sed -n 's/.*"peak_total_bytes":\([0-9]*\).*/\1/p' "$work/lora_log.jsonl" | tr '\n' ' ')"
# --max-memory searches LoRA runs with their own step: the planned QLoRA run fits and peaks where predicted.
"$train_gpt" --model llama-tiny --lora-r 8 --lora-target-modules all-linear --load-in-4bit --max-memory 2.5MiB \
  --global-batch-size 8 --max-steps 2 --log "$work/lora_planned.jsonl" >"$work/lora_planned.txt" 2>&1 ||
  fail "the planned QLoRA run exited $?: $(tail -3 "$work/lora_planned.txt")"
lora_planned=$(sed -n 's/^  predicted peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/lora_planned.txt")
for measured in $(sed -n 's/.*"peak_total_bytes":\([0-9]*\).*/\1/p' "$work/lora_planned.jsonl"); do
  [ "$measured" = "$lora_planned" ] || fail "planned QLoRA: measured peak $measured B, predicted $lora_planned B"
  [ "$measured" -le 2621440 ] || fail "planned QLoRA: measured peak $measured B exceeds the budget"
done
echo "planned QLoRA run: predicted $lora_planned B, measured $(sed -n 's/.*"peak_total_bytes":\([0-9]*\).*/\1/p' "$work/lora_planned.jsonl" | tr '\n' ' ')"
"$train_gpt" --model tiny --lora-r 8 --plan --offload-optimizer cpu --device cpu >"$work/gpt_lora_plan.txt" 2>&1
grep -q "not predicted for these flags" "$work/gpt_lora_plan.txt" || fail "--plan with LoRA off the device: $(cat "$work/gpt_lora_plan.txt")"

# A feasible budget trains: each step's measured peak equals the predicted one and fits. 2.5 MiB admits only
# micro-batches of 1 for the tiny model at a global batch of 16.
budget=2621440
"$train_gpt" --max-memory 2.5MiB --global-batch-size 16 --max-steps 2 --log "$work/log.jsonl" >"$work/run.txt" 2>&1 ||
  fail "the planned run exited $?: $(tail -3 "$work/run.txt")"
predicted=$(sed -n 's/^  predicted peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/run.txt")
for measured in $(sed -n 's/.*"peak_total_bytes":\([0-9]*\).*/\1/p' "$work/log.jsonl"); do
  [ "$measured" = "$predicted" ] || fail "measured peak $measured B, predicted $predicted B"
  [ "$measured" -le "$budget" ] || fail "measured peak $measured B exceeds the budget $budget B"
done
[ "$(wc -l <"$work/log.jsonl")" -eq 2 ] || fail "expected 2 logged steps"
grep -q "batch 1 x 16 micro-batches" "$work/run.txt" || fail "the run did not use the plan: $(grep batch "$work/run.txt")"
echo "planned run: predicted $predicted B, measured $(sed -n 's/.*"peak_total_bytes":\([0-9]*\).*/\1/p' "$work/log.jsonl" | tr '\n' ' ')"

# Every phase of a planned run stays within its budget: the same budget with --eval-data, --out and a resume from
# what it saved. The planner prices the evaluation beside each step (and a micro-batch that fits the step alone but
# whose evaluation does not is not chosen); the save and the resume hold the model state alone.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 200) >"$work/eval.txt"
phases=(--max-memory 2.5MiB --global-batch-size 16 --eval-data "$work/eval.txt" --eval-steps 4 --out "$work/state")
"$train_gpt" "${phases[@]}" --max-steps 2 --log "$work/phases.jsonl" >"$work/phases.txt" 2>&1 ||
  fail "the planned run with every phase exited $?: $(tail -3 "$work/phases.txt")"
"$train_gpt" "${phases[@]}" --max-steps 3 --resume "$work/state" --log "$work/phases_resumed.jsonl" \
  >"$work/phases_resumed.txt" 2>&1 || fail "the planned resume exited $?: $(tail -3 "$work/phases_resumed.txt")"
measured_phases=$( (grep -oh '"\(eval_\)\?peak_total_bytes":[0-9]*' "$work/phases.jsonl" "$work/phases_resumed.jsonl" |
  sed 's/.*://'
  sed -n 's/^saved training state .*; peak \([0-9]*\) B)$/\1/p; s/^resumed from .* (peak \([0-9]*\) B)$/\1/p' \
    "$work/phases.txt" "$work/phases_resumed.txt") | sort -n | tr '\n' ' ')
[ "$(echo $measured_phases | wc -w)" -ge 8 ] || fail "expected steps, evaluations, saves and a resume: $measured_phases"
for measured in $measured_phases; do
  [ "$measured" -le "$budget" ] || fail "a phase of the planned run peaked at $measured B, over the budget $budget B"
done
echo "planned run with every phase: peaks $measured_phases (budget $budget B)"

[ "$failures" -eq 0 ] && echo "all planner CLI checks passed" || exit 1
