#!/usr/bin/env bash
# ctest train_gpt_zero3: ZeRO stage 3 (docs/DISTRIBUTED.md, "ZeRO stage 3") over Open MPI on padded data whose token
# counts differ between ranks. Stage 3 sums the gradients exactly as stage 2 does and gathers each segment's weights
# bit for bit from their owners, so it trains bitwise as stage 2: a 6-layer tiny GPT checkpointed every layer (two
# micro-batches a step, AdamW with clipping, 2 ranks; bf16 with evaluation on 3 ranks) and a Llama with kept layers
# beside the sharded ones and offloaded inputs (its untied token table and head sharded too, and resumed bitwise). The
# per-rank peak is --plan's to the byte (the evaluation's too), below stage 2's and falling from 2 to 3 ranks; the gathers per step are two passes over the segments per
# micro-batch; a stage-3 state resumes bitwise (also with the parts cut into many pieces), and at stage 3 only; stage 3
# without checkpointing is refused.
# usage: train_gpt_zero3.sh TRAIN_GPT MPIEXEC WORK_DIR
set -u
train_gpt=$1
mpiexec=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/mpi_runs.sh"
write_documents "$work/docs.txt" 13
common=(--data "$work/docs.txt" --data-layout padded --seq-len 48 --lr-scheduler-type constant --warmup-steps 0
        --learning-rate 1e-3 --per-device-train-batch-size 2 --gradient-checkpointing)
gpt=("${common[@]}" --dropout 0 --model tiny --n-layer 6 --every-n-layers 1)

# The value of every "communication" field named $2 in the log $1, one per line.
field() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1" | sort -u; }
losses() { sed -n 's/.*"loss":\([-0-9.e]*\).*/\1/p' "$1"; }
peak() { sed -n 's/^  step peak [^(]*(\([0-9]*\) B;.*/\1/p' "$1"; }

# 1. 2 ranks, two micro-batches a step, 20 steps: stages 2 and 3 give the same losses and weights bit for bit, and the
#    replicas of what stage 3 keeps whole agree every step.
for stage in 2 3; do
  ranks 2 "$train_gpt" "${gpt[@]}" --zero-stage $stage --gradient-accumulation-steps 2 --max-steps 20 --check-replicas \
    --log "$work/two_$stage.jsonl" --save "$work/two_$stage.safetensors" >"$work/two_$stage.out" 2>&1
  check "2 ranks, stage $stage, two micro-batches a step" $? "$(tail -5 "$work/two_$stage.out")"
done
cmp -s "$work/two_2.safetensors" "$work/two_3.safetensors"
check "2 ranks: stages 2 and 3 give bitwise the same weights" $? "the saved weights differ"
[ "$(losses "$work/two_2.jsonl")" = "$(losses "$work/two_3.jsonl")" ] && [ -n "$(losses "$work/two_3.jsonl")" ]
check "2 ranks: stages 2 and 3 log the same losses" $? "see two_2.jsonl and two_3.jsonl"
[ "$(grep -c '"replicas_identical":true' "$work/two_3.jsonl")" -ge 3 ]
check "stage 3: the replicas agree on what they keep whole" $? "$(grep -o '"replica_hash":"[0-9a-f]*"' "$work/two_3.jsonl" | head -2)"

# 2. 3 ranks, bf16, one micro-batch a step, evaluated every 5 steps (each segment gathered for the evaluation's
#    forward too): stages 2 and 3 bitwise, the evaluation losses too.
for stage in 2 3; do
  ranks 3 "$train_gpt" "${gpt[@]}" --zero-stage $stage --precision bf16 --gradient-accumulation-steps 1 --max-steps 10 \
    --eval-data "$work/docs.txt" --eval-every 5 --eval-steps 4 --log "$work/three_$stage.jsonl" \
    --save "$work/three_$stage.safetensors" >"$work/three_$stage.out" 2>&1
  check "3 ranks, bf16, stage $stage" $? "$(tail -5 "$work/three_$stage.out")"
done
cmp -s "$work/three_2.safetensors" "$work/three_3.safetensors" &&
  [ "$(grep '^eval step' "$work/three_2.out")" = "$(grep '^eval step' "$work/three_3.out")" ] &&
  [ -n "$(grep '^eval step' "$work/three_3.out")" ]
check "3 ranks, bf16: stages 2 and 3 give bitwise the same weights and evaluation losses" $? \
  "$(grep '^eval step' "$work/three_2.out" "$work/three_3.out")"
# The evaluation's peak at stage 3 (each segment's weights gathered for its no-grad forward) is --plan's to the byte.
"$train_gpt" "${gpt[@]}" --zero-stage 3 --precision bf16 --gradient-accumulation-steps 1 --eval-data "$work/docs.txt" \
  --eval-steps 4 --plan --world-size 3 >"$work/plan_three_eval.out" 2>&1
eval_predicted=$(sed -n 's/^evaluation (.*): peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/plan_three_eval.out")
eval_measured=$(sed -n 's/.*"eval_peak_total_bytes":\([0-9]*\).*/\1/p' "$work/three_3.jsonl" | sort -u)
[ -n "$eval_predicted" ] && [ "$eval_predicted" = "$eval_measured" ]
eval_status=$? # before the check's arguments expand (a command substitution there would reset $?)
check "3 ranks, bf16, stage 3: the evaluation's peak, predicted $eval_predicted B, measured $(echo $eval_measured)" $eval_status \
  "$(grep '^evaluation' "$work/plan_three_eval.out")"

# 3. Llama, a checkpointed layer and a kept one in turn (the kept ones stay whole), inputs offloaded, clipping at 0.5.
llama=("${common[@]}" --model llama-tiny --every-n-layers 2 --offload --max-grad-norm 0.5)
for stage in 2 3; do
  ranks 2 "$train_gpt" "${llama[@]}" --zero-stage $stage --max-steps 10 --log "$work/llama_$stage.jsonl" \
    --save "$work/llama_$stage.safetensors" >"$work/llama_$stage.out" 2>&1
  check "Llama, 2 ranks, stage $stage" $? "$(tail -5 "$work/llama_$stage.out")"
done
cmp -s "$work/llama_2.safetensors" "$work/llama_3.safetensors"
check "Llama with kept layers: stages 2 and 3 give bitwise the same weights" $? "they differ"
# The untied Llama's token table and head are released at stage 3 too: saved gathered from the shards, resumed into them.
check_resume 2 llama3 3 6 "${llama[@]}" --zero-stage 3

# 4. Memory: each run's per-rank step peak is --plan's to the byte; stage 3's is below stage 2's, and falls from 2 ranks
#    to 3 (the same flags, one micro-batch a step: the bf16 runs above, and their 2-rank twin here).
ranks 2 "$train_gpt" "${gpt[@]}" --zero-stage 3 --precision bf16 --gradient-accumulation-steps 1 --max-steps 2 \
  --log "$work/bf16_two.jsonl" >"$work/bf16_two.out" 2>&1
check "2 ranks, bf16, stage 3" $? "$(tail -5 "$work/bf16_two.out")"
all_ok=0
detail=""
for run in "two 2 --gradient-accumulation-steps 2" "two 3 --gradient-accumulation-steps 2" \
           "three 2 --precision bf16 --gradient-accumulation-steps 1" "three 3 --precision bf16 --gradient-accumulation-steps 1"; do
  set -- $run
  name=$1 stage=$2
  shift 2
  world=2
  [ "$name" = three ] && world=3
  "$train_gpt" "${gpt[@]}" --zero-stage $stage "$@" --plan --world-size $world >"$work/plan_${name}_$stage.out" 2>&1
  predicted=$(peak "$work/plan_${name}_$stage.out")
  measured=$(field "$work/${name}_$stage.jsonl" peak_total_bytes | sort -n | tail -1)
  detail="$detail $name/$stage: predicted $predicted, measured $measured;"
  [ -n "$predicted" ] && [ "$predicted" = "$measured" ] || all_ok=1
done
"$train_gpt" "${gpt[@]}" --zero-stage 3 --precision bf16 --gradient-accumulation-steps 1 --plan --world-size 2 >"$work/plan_bf16_two.out" 2>&1
[ "$(peak "$work/plan_bf16_two.out")" = "$(field "$work/bf16_two.jsonl" peak_total_bytes | sort -n | tail -1)" ] || all_ok=1
"$train_gpt" "${llama[@]}" --zero-stage 3 --plan --world-size 2 >"$work/plan_llama_3.out" 2>&1
llama_predicted=$(sed -n 's/^  step peak .*as on the CPU: \([0-9]*\) B).*/\1/p' "$work/plan_llama_3.out")
llama_measured=$(field "$work/llama_3.jsonl" peak_total_bytes | sort -n | tail -1)
detail="$detail llama/3: predicted $llama_predicted (CPU), measured $llama_measured"
[ -n "$llama_predicted" ] && [ "$llama_predicted" = "$llama_measured" ] || all_ok=1
check "every run's per-rank step peak is --plan's to the byte" $all_ok "$detail"
two_2=$(field "$work/two_2.jsonl" peak_total_bytes | sort -n | tail -1)
two_3=$(field "$work/two_3.jsonl" peak_total_bytes | sort -n | tail -1)
three_2=$(field "$work/three_2.jsonl" peak_total_bytes | sort -n | tail -1)
three_3=$(field "$work/three_3.jsonl" peak_total_bytes | sort -n | tail -1)
bf16_two=$(field "$work/bf16_two.jsonl" peak_total_bytes | sort -n | tail -1)
[ "$two_3" -lt "$two_2" ] && [ "$three_3" -lt "$three_2" ] && [ "$three_3" -lt "$bf16_two" ]
check "stage 3 peaks below stage 2 (2 ranks: $two_3 < $two_2 B; 3 ranks, bf16: $three_3 < $three_2 B) and falls from 2 ranks to 3 ($bf16_two > $three_3 B)" \
  $? "see above"
grep -q "^ZeRO stage 3 over 2 ranks: .*parameters per rank at their peak" "$work/plan_two_3.out"
check "--plan names stage 3 and the parameters per rank" $? "$(grep ZeRO "$work/plan_two_3.out")"

# 5. The collectives: no all-gather; the gathers are broadcasts, one per tensor, two passes over the segments per
#    micro-batch (a segment's forward and its recompute) and one over the parameters kept whole per step; the reduces
#    as stage 2's.
[ "$(field "$work/two_3.jsonl" all_gathers)" = 0 ] && [ "$(field "$work/two_3.jsonl" reduces)" = "$(field "$work/two_2.jsonl" reduces)" ]
check "stage 3: no all-gather, the reduces of stage 2" $? "$(grep -o '"communication":{[^}]*}' "$work/two_3.jsonl" | head -1)"
"$python" - "$(field "$work/bf16_two.jsonl" broadcasts)" "$(field "$work/two_3.jsonl" broadcasts)" <<'PY'
import sys
one, two = int(sys.argv[1]), int(sys.argv[2])
# one = 2S + W (S: the broadcasts of one pass over the segments, W: the parameters kept whole); two = 4S + W. One
# broadcast per tensor and owner: 6 layers of 12 tensors, plus one where a tensor straddles the ranks' boundary; W
# is wte, wpe and ln_f's two.
passes = (two - one) // 2
print(f"broadcasts per step: {one} with one micro-batch, {two} with two: {passes} per pass over the segments")
sys.exit(0 if (two - one) % 2 == 0 and 72 <= passes <= 73 and 4 <= one - 2 * passes <= 5 else 1)
PY
check "stage 3 gathers the segments twice per micro-batch and the parameters kept whole once per step" $? "see above"

# 6. Resume on 3 ranks: a stage-3 state (each released parameter gathered as it is written) saved at step 4 and
#    resumed (read straight into the shards) to step 8 equals the straight run bit for bit.
check_resume 3 stage3 4 8 "${gpt[@]}" --zero-stage 3 --gradient-accumulation-steps 2
check_other_stage 3 "$work/stage3_state" 3 2 "${gpt[@]}" --gradient-accumulation-steps 2 --max-steps 8

# 6b. With 4 KiB buckets (the parts cut into many pieces, so a save's windows and the reduces cross tensors and
#     owners many times over): stage 3 on 3 ranks still equals stage 2 bitwise, and resumes bitwise.
ranks 3 -x ENGINE_ZERO_BUCKET_BYTES=4096 "$train_gpt" "${gpt[@]}" --zero-stage 2 --gradient-accumulation-steps 2 \
  --max-steps 6 --save "$work/small_2.safetensors" >"$work/small_2.out" 2>&1
check "3 ranks, 4 KiB buckets, stage 2" $? "$(tail -5 "$work/small_2.out")"
export ENGINE_ZERO_BUCKET_BYTES=4096 # inherited by the local ranks
check_resume 3 small3 3 6 "${gpt[@]}" --zero-stage 3 --gradient-accumulation-steps 2
unset ENGINE_ZERO_BUCKET_BYTES
cmp -s "$work/small_2.safetensors" "$work/small3_straight.safetensors"
check "4 KiB buckets: stages 2 and 3 give bitwise the same weights" $? "they differ"

# 7. Refused before anything trains, one line, exit 2: stage 3 without checkpointing.
"$train_gpt" --data "$work/docs.txt" --data-layout padded --seq-len 48 --model tiny --zero-stage 3 --max-steps 1 \
  >"$work/bad.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q "zero-stage.*needs gradient_checkpointing\|zero-stage.*needs --gradient-checkpointing" "$work/bad.out" &&
  [ "$(wc -l <"$work/bad.out")" -le 2 ]
check "--zero-stage 3 without checkpointing: exit 2, one line naming the flag" $? "exit $code: $(cat "$work/bad.out")"

echo "train_gpt_zero3: $((total - failures)) of $total checks passed"
[ $failures -eq 0 ]
