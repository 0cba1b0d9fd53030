#!/usr/bin/env bash
# ctest train_gpt_batch_invariant: --batch-invariant (docs/TRAINING.md, "The big batch, bitwise") on padded data, AdamW
# with weight decay and clipping, 20 steps, f32 and bf16: 1 process x micro-batch 1 x accumulation 4, 1 x 4 x 1, and 2
# MPI ranks x 1 x 2 (also at ZeRO-1, and x 2 x 1 with checkpointing and offload) save bitwise the same weights and log the same losses and norms;
# without the mode the 2-rank run differs; one process's and 2 ranks' step peaks are --plan's to the byte; the plans --max-memory
# chooses at two budgets train the same bits; a 2-rank run saved at step 2
# resumes bitwise; bad flags exit 2 naming the flag.
# usage: train_gpt_batch_invariant.sh TRAIN_GPT MPIEXEC WORK_DIR
set -u
train_gpt=$1
mpiexec=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/mpi_runs.sh"
write_documents "$work/docs.txt" 11
base=(--data "$work/docs.txt" --data-layout padded --seq-len 48 --lr-scheduler-type constant --warmup-steps 0
      --learning-rate 3e-3 --weight-decay 0.1 --max-grad-norm 0.5 --max-steps 20)
common=("${base[@]}" --dropout 0 --model tiny)

# same_run NAME A B: the two runs' weights are the same bytes and their logged losses and norms the same numbers.
same_run() {
  cmp -s "$work/$2.safetensors" "$work/$3.safetensors" &&
    "$python" - "$work/$2.jsonl" "$work/$3.jsonl" <<'PY'
import json, sys
a, b = ([(l["step"], l["loss"], l["grad_norm"]) for l in map(json.loads, open(p))] for p in sys.argv[1:3])
assert len(a) == 20 and a == b, f"{a[:3]} vs {b[:3]}"
assert a[0][2] > 0.5, f"clipping inactive: norm {a[0][2]}"
PY
  check "$1" $? "weights or losses differ"
}

for precision in fp32 bf16; do
  run() { # NAME RANKS ROWS ACCUMULATION EXTRA...
    local name=$1 count=$2 rows=$3 steps=$4
    shift 4
    ranks "$count" "$train_gpt" "${common[@]}" --precision "$precision" --per-device-train-batch-size "$rows" \
      --gradient-accumulation-steps "$steps" --log "$work/$name.jsonl" --save "$work/$name.safetensors" "$@" \
      >"$work/$name.out" 2>&1
    check "$name: $count rank(s) x micro-batch $rows x accumulation $steps $*" $? "$(tail -5 "$work/$name.out")"
  }
  run "${precision}_1x1x4" 1 1 4 --batch-invariant
  run "${precision}_1x4x1" 1 4 1 --batch-invariant
  run "${precision}_2x1x2" 2 1 2 --batch-invariant
  run "${precision}_2x2x1_checkpointed" 2 2 1 --batch-invariant --gradient-checkpointing --offload
  run "${precision}_2x1x2_zero1" 2 1 2 --batch-invariant --zero-stage 1
  run "${precision}_2x1x2_default" 2 1 2
  same_run "$precision: 1 x 4 x 1 trains 1 x 1 x 4's bits" "${precision}_1x1x4" "${precision}_1x4x1"
  same_run "$precision: 2 ranks x 1 x 2 train 1 x 1 x 4's bits" "${precision}_1x1x4" "${precision}_2x1x2"
  same_run "$precision: 2 ranks x 2 x 1 with checkpointing and offload train 1 x 1 x 4's bits" "${precision}_1x1x4" \
    "${precision}_2x2x1_checkpointed"
  same_run "$precision: 2 ranks x 1 x 2 at ZeRO-1 train 1 x 1 x 4's bits" "${precision}_1x1x4" "${precision}_2x1x2_zero1"
  ! cmp -s "$work/${precision}_1x1x4.safetensors" "$work/${precision}_2x1x2_default.safetensors"
  check "$precision: without the mode 2 ranks x 1 x 2 differ from it (the comparison can fail)" $? "they are equal"
done

# A Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention, an untied head): 2 ranks x 1 x 2 against 1 x 4 x 1.
llama=(--model llama-tiny --precision bf16 --batch-invariant)
ranks 2 "$train_gpt" "${base[@]}" "${llama[@]}" --per-device-train-batch-size 1 --gradient-accumulation-steps 2 \
  --log "$work/llama_2x1x2.jsonl" --save "$work/llama_2x1x2.safetensors" >"$work/llama_2x1x2.out" 2>&1
check "llama: 2 ranks x 1 x 2" $? "$(tail -5 "$work/llama_2x1x2.out")"
"$train_gpt" "${base[@]}" "${llama[@]}" --per-device-train-batch-size 4 --gradient-accumulation-steps 1 \
  --log "$work/llama_1x4x1.jsonl" --save "$work/llama_1x4x1.safetensors" >"$work/llama_1x4x1.out" 2>&1
check "llama: 1 x 4 x 1" $? "$(tail -5 "$work/llama_1x4x1.out")"
same_run "llama bf16: 2 ranks x 1 x 2 train 1 x 4 x 1's bits" llama_1x4x1 llama_2x1x2

# The step peak on one process is --plan's to the byte: chunks of 1 and of 2 (bf16), with checkpointing, and with a
# vocabulary GPT-2 pads (wte's gradient shows V rows, the sums are beside those).
for extra in "--batch-invariant" "--batch-invariant-chunk 2 --precision bf16" "--batch-invariant --gradient-checkpointing" \
             "--batch-invariant --vocab-size 200"; do
  planned=("${common[@]}" --max-steps 3 --per-device-train-batch-size 4 --gradient-accumulation-steps 2 $extra)
  predicted=$("$train_gpt" "${planned[@]}" --plan 2>&1 | sed -n 's/^  step peak [^(]*(\([0-9]*\) B;.*/\1/p')
  "$train_gpt" "${planned[@]}" --log "$work/peak.jsonl" >"$work/peak.out" 2>&1
  code=$?
  measured=$("$python" -c "import json, sys; print(' '.join(sorted({str(json.loads(l)['peak_total_bytes']) for l in open(sys.argv[1])})))" "$work/peak.jsonl")
  [ $code -eq 0 ] && [ -n "$predicted" ] && [ "$measured" = "$predicted" ]
  check "$extra: every step's peak is --plan's ($predicted B)" $? "exit $code, measured $measured B"
done

# With 2 ranks too, every rank's step peak is --plan --world-size 2's: the staging bucket of the gradients' all-reduce is
# in the plan (stage 0 without the mode: the f32 gradients' after the window; the mode: the f64 sums' at its end).
for extra in "" "--batch-invariant" "--batch-invariant --zero-stage 1" "--batch-invariant --precision bf16 --gradient-checkpointing" \
             "--model llama-tiny" "--model llama-tiny --batch-invariant"; do
  planned=("${base[@]}" --max-steps 2 --per-device-train-batch-size 2 --gradient-accumulation-steps 2)
  case "$extra" in *llama*) ;; *) planned+=(--dropout 0 --model tiny) ;; esac
  predicted=$("$train_gpt" "${planned[@]}" $extra --plan --world-size 2 2>&1 | sed -n 's/^  step peak [^(]*(\([0-9]*\) B;.*/\1/p')
  ranks 2 "$train_gpt" "${planned[@]}" $extra --log "$work/peak2.jsonl" >"$work/peak2.out" 2>&1
  code=$?
  measured=$("$python" -c "import json, sys; print(' '.join(sorted({str(json.loads(l)['peak_total_bytes']) for l in open(sys.argv[1])})))" "$work/peak2.jsonl")
  [ $code -eq 0 ] && [ -n "$predicted" ] && [ "$measured" = "$predicted" ]
  check "2 ranks $extra: every step's peak is --plan --world-size 2's ($predicted B)" $? "exit $code, measured $measured B"
done

# --max-memory at two budgets: the planner keeps the chunk and chooses two plans (with and without checkpointing), which
# train bitwise the same run, each within its budget.
for budget in 4MiB 3200KiB; do
  "$train_gpt" "${common[@]}" --batch-invariant --max-memory "$budget" --global-batch-size 4 \
    --log "$work/budget_$budget.jsonl" --save "$work/budget_$budget.safetensors" >"$work/budget_$budget.out" 2>&1
  code=$?
  peak=$("$python" -c "import json, sys; print(max(json.loads(l)['peak_total_bytes'] for l in open(sys.argv[1])))" "$work/budget_$budget.jsonl")
  limit=$("$python" -c "print({'4MiB': 4 << 20, '3200KiB': 3200 << 10}['$budget'])")
  [ $code -eq 0 ] && [ "$peak" -le "$limit" ]
  check "--max-memory $budget: $(grep '^chosen:' "$work/budget_$budget.out"), peak $peak B" $? "exit $code: $(tail -3 "$work/budget_$budget.out")"
done
! diff -q <(grep '^chosen:' "$work/budget_4MiB.out") <(grep '^chosen:' "$work/budget_3200KiB.out") >/dev/null
check "the two budgets chose two plans" $? "the same plan: $(grep '^chosen:' "$work/budget_4MiB.out")"
same_run "the two budgets' plans train the same bits" budget_4MiB budget_3200KiB

check_resume 2 invariant 2 4 "${common[@]}" --batch-invariant --per-device-train-batch-size 2

"$train_gpt" "${common[@]}" --per-device-train-batch-size 4 --batch-invariant-chunk 3 >"$work/bad.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q -- "--batch-invariant-chunk: 3 does not divide per_device_train_batch_size 4" "$work/bad.out"
check "a chunk that does not divide the micro-batch: exit 2 naming the flag" $? "exit $code: $(tail -2 "$work/bad.out")"
"$train_gpt" "${common[@]}" --batch-invariant-chunk 3 --max-memory 1GiB --global-batch-size 4 >"$work/plan.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q -- "--batch-invariant-chunk: 3 does not divide each rank's 4 sequences" "$work/plan.out"
check "--max-memory with a chunk that does not divide the global batch: exit 2 naming the flag" $? "exit $code: $(tail -2 "$work/plan.out")"

"$train_gpt" "${common[@]}" --batch-invariant-chunk 2 --max-tokens-per-micro-batch 96 >"$work/budget.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q -- "--batch-invariant-chunk: 2 need not divide the rows --max-tokens-per-micro-batch" "$work/budget.out"
check "a chunk of 2 with a token budget: exit 2 naming the flag" $? "exit $code: $(tail -2 "$work/budget.out")"

echo "$((total - failures)) of $total checks passed"
[ "$failures" -eq 0 ]
