#!/usr/bin/env bash
# ctest train_gpt_state_phases: loading --init's weights streams them a chunk at a time (nn::load_safetensors_into), and
# saving and resuming a training state stream it tensor by tensor (optim/training_state.h), so these phases hold the
# model and nothing beside it; --plan predicts the load's peak too. --plan with --out and --resume predicts each phase's
# peak (planner::predict_state_phases); the runs print what they measured ("saved training state ... (... peak N B)",
# "resumed from ... (peak N B)"): equal to the byte, for a full GPT-2 run, a bf16 Llama run with checkpointing and
# a QLoRA run. The resumed runs' losses are bitwise the straight runs'. usage: train_gpt_state_phases.sh TRAIN_GPT WORK
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}

# One case: a straight run of 3 steps; a run of 2 that saves; a run resumed from it to 3. NAME FLAGS...
phases_match() {
  local name=$1
  shift
  local state="$work/$name.state"
  "$train_gpt" "$@" --max-steps 3 --log "$work/$name.straight.jsonl" >"$work/$name.straight.out" 2>&1
  check "$name: straight run" $? "$(tail -2 "$work/$name.straight.out")"
  "$train_gpt" "$@" --max-steps 2 --out "$state" >"$work/$name.save.out" 2>&1
  check "$name: run that saves" $? "$(tail -2 "$work/$name.save.out")"
  "$train_gpt" "$@" --max-steps 3 --resume "$state" --log "$work/$name.resumed.jsonl" >"$work/$name.resume.out" 2>&1
  check "$name: resumed run" $? "$(tail -2 "$work/$name.resume.out")"
  "$train_gpt" "$@" --max-steps 3 --out "$state" --resume "$state" --plan >"$work/$name.plan.out" 2>&1
  check "$name: --plan" $? "$(tail -2 "$work/$name.plan.out")"
  local predicted_save predicted_resume measured_save measured_resume
  predicted_save=$(sed -n 's/^save (--out, .*): peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/$name.plan.out")
  predicted_resume=$(sed -n 's/^resume (--resume, .*): peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/$name.plan.out")
  measured_save=$(sed -n 's/^saved training state .*; peak \([0-9]*\) B)$/\1/p' "$work/$name.save.out" | sort -u)
  measured_resume=$(sed -n 's/^resumed from .* (peak \([0-9]*\) B)$/\1/p' "$work/$name.resume.out")
  [ -n "$predicted_save" ] && [ "$measured_save" = "$predicted_save" ]
  check "$name: the save's peak, predicted $predicted_save B, measured $measured_save B" $? \
    "$(grep -E '^save|^saved' "$work/$name.plan.out" "$work/$name.save.out")"
  [ -n "$predicted_resume" ] && [ "$measured_resume" = "$predicted_resume" ]
  check "$name: the resume's peak, predicted $predicted_resume B, measured $measured_resume B" $? \
    "$(grep -E '^resume' "$work/$name.plan.out" "$work/$name.resume.out")"
  grep -q "saved training state .* (device memory +0 B; " "$work/$name.save.out"
  check "$name: the save adds nothing to the account" $? "$(grep saved "$work/$name.save.out")"
  local resumed_loss straight_loss
  resumed_loss=$(grep '"step":3' "$work/$name.resumed.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
  straight_loss=$(grep '"step":3' "$work/$name.straight.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
  [ -n "$straight_loss" ] && [ "$resumed_loss" = "$straight_loss" ]
  check "$name: the resumed step's loss is the straight run's" $? "$(grep '"step":3' "$work/$name".*.jsonl)"
}

# The load of --init's weights streams them a chunk at a time into the model as built: its peak is --plan's. NAME
# MODEL FLAGS...: a file saved by a run of MODEL, loaded by a run with FLAGS.
load_matches() {
  local name=$1 model=$2
  shift 2
  "$train_gpt" --model "$model" --max-steps 1 --save "$work/$name.safetensors" >"$work/$name.weights.out" 2>&1
  check "$name: weights to load" $? "$(tail -2 "$work/$name.weights.out")"
  "$train_gpt" --model "$model" --init "$work/$name.safetensors" --max-steps 1 "$@" >"$work/$name.load.out" 2>&1
  check "$name: a run from --init" $? "$(tail -2 "$work/$name.load.out")"
  local predicted measured
  predicted=$("$train_gpt" --model "$model" --init "$work/$name.safetensors" --max-steps 1 "$@" --plan 2>&1 |
    sed -n 's/^load (--init, .*): peak [^(]*(\([0-9]*\) B).*/\1/p')
  measured=$(sed -n 's/^loaded --init .* (peak \([0-9]*\) B)$/\1/p' "$work/$name.load.out")
  [ -n "$predicted" ] && [ "$measured" = "$predicted" ]
  check "$name: the load's peak, predicted $predicted B, measured $measured B" $? "$(grep loaded "$work/$name.load.out")"
}

load_matches gpt2_load tiny
load_matches llama_load llama-tiny --precision bf16 --gradient-checkpointing
load_matches qlora_load llama-tiny --lora-r 4 --load-in-4bit --precision bf16

phases_match gpt2 --model tiny --dropout 0.1 --per-device-train-batch-size 4 --gradient-accumulation-steps 2
phases_match llama_bf16 --model llama-tiny --precision bf16 --gradient-checkpointing --per-device-train-batch-size 4
phases_match qlora --model llama-tiny --lora-r 4 --lora-target-modules all-linear --load-in-4bit --precision bf16 \
  --gradient-checkpointing --per-device-train-batch-size 4

echo "$((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
