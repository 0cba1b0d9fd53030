#!/usr/bin/env bash
# ctest train_gpt_mpi: data parallelism over Open MPI with 2 ranks on padded data whose token counts differ
# between ranks. Token mode: 2 ranks x batch 2 equal 1 process x batch 4 (per-step losses, final weights);
# mean mode must differ; replicas are bitwise equal after every step; each step makes one count, one gradient
# and one loss all-reduce whatever the accumulation; a 2-rank resume is bitwise; a resume with another world
# size is refused; ZeRO stage 1 gives the same training with half the optimizer state per rank; --eval-data
# evaluates over both ranks as one process does; one rank's failure ends the job. usage: train_gpt_mpi.sh TRAIN_GPT CHECK_COMMUNICATOR MPIEXEC WORK_DIR
set -u
train_gpt=$1
check_communicator=$2
mpiexec=$3
work=$4
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/mpi_runs.sh"
write_documents "$work/docs.txt" 7
common=(--data "$work/docs.txt" --data-layout padded --seq-len 48 --lr-scheduler-type constant --warmup-steps 0
        --learning-rate 1e-3 --dropout 0 --model tiny)

# 1. The communicator itself: every call, exact sums, a bad root refused naming the rank.
mpirun2 "$check_communicator" mpi >"$work/communicator.out" 2>&1
check "check_communicator mpi on 2 ranks" $? "$(tail -5 "$work/communicator.out")"

# 2. Token mode: 2 ranks x 2 sequences x 2 micro-batches against 1 process x 4 x 2. The 2-rank run also checks
#    its replicas every step and saves states at steps 2 and 4.
mpirun2 "$train_gpt" "${common[@]}" --per-device-train-batch-size 2 --gradient-accumulation-steps 2 --max-steps 4 \
  --check-replicas --log "$work/ranks2.jsonl" --save "$work/ranks2.safetensors" >"$work/ranks2.out" 2>&1
check "2-rank token-mode run" $? "$(tail -5 "$work/ranks2.out")"
"$train_gpt" "${common[@]}" --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --max-steps 4 \
  --log "$work/ranks1.jsonl" --save "$work/ranks1.safetensors" >"$work/ranks1.out" 2>&1
check "1-process token-mode run" $? "$(tail -5 "$work/ranks1.out")"
[ "$(grep -c '^step ' "$work/ranks2.out")" -eq 4 ]
check "only rank 0 prints" $? "$(grep -c '^step ' "$work/ranks2.out") step lines for 4 steps"

cat >"$work/compare.py" <<'PY'
# compare.py A.jsonl B.jsonl A.safetensors B.safetensors MODE. MODE equal: losses, gradient norms and weights
# within 1e-6; equal-losses: losses and gradient norms (AdamW divides each gradient element by its own
# root-mean-square, so an element whose true gradient is near zero turns rounding noise into a full step of
# either sign: its weights are compared under SGD, whose update is linear in the gradient); differ: weights differ.
import json, struct, sys
from array import array
def losses(path): return {l["step"]: l for l in map(json.loads, open(path))}
def tensors(path):
    data = open(path, "rb").read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__": continue
        begin, end = info["data_offsets"]
        values = array("f"); values.frombytes(data[8 + size + begin:8 + size + end]); out[name] = values
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == sorted(b), f"steps {sorted(a)} vs {sorted(b)}"
loss_rel = max(abs(a[s]["loss"] - b[s]["loss"]) / abs(b[s]["loss"]) for s in a)
norm_rel = max(abs(a[s]["grad_norm"] - b[s]["grad_norm"]) / abs(b[s]["grad_norm"]) for s in a)
items = [(a[s]["num_items_in_batch"], b[s]["num_items_in_batch"]) for s in sorted(a)]
assert all(x == y for x, y in items), f"num_items_in_batch differ: {items}"
ta, tb = tensors(sys.argv[3]), tensors(sys.argv[4])
weight_rel = 0.0   # per tensor: max |a-b| / max |b|
element_rel = 0.0  # per element: |a-b| / |b| over elements with |b| >= 1e-2
for name in tb:
    scale = max(abs(v) for v in tb[name]) or 1.0
    diffs = [abs(x - y) for x, y in zip(ta[name], tb[name])]
    weight_rel = max(weight_rel, max(diffs) / scale)
    element_rel = max([element_rel] + [d / abs(y) for d, y in zip(diffs, tb[name]) if abs(y) >= 1e-2])
print(f"max relative loss difference {loss_rel:.3e}, grad norm {norm_rel:.3e}, weights {weight_rel:.3e} "
      f"(elementwise, |w| >= 1e-2: {element_rel:.3e}); num_items_in_batch per step {[x for x, _ in items]}")
if sys.argv[5] == "equal":
    assert loss_rel <= 1e-6 and norm_rel <= 1e-6 and weight_rel <= 1e-6, "token mode must match one process within 1e-6"
elif sys.argv[5] == "equal-losses":
    assert loss_rel <= 1e-6 and norm_rel <= 1e-6, "token mode must match one process within 1e-6"
else:
    assert weight_rel > 1e-4, "mean mode must differ from one process (the per-rank mean weighs tokens unequally)"
PY
"$python" "$work/compare.py" "$work/ranks2.jsonl" "$work/ranks1.jsonl" "$work/ranks2.safetensors" \
  "$work/ranks1.safetensors" equal-losses
check "token mode, AdamW: 2 ranks x 2 give 1 process x 4's losses and gradient norms within 1e-6" $? "see above"
for ranks in 2 1; do
  launcher=(); [ "$ranks" = 2 ] && launcher=("$mpiexec" --oversubscribe -np 2)
  "${launcher[@]}" "$train_gpt" "${common[@]}" --optimizer sgd --per-device-train-batch-size $((4 / ranks)) \
    --gradient-accumulation-steps 2 --max-steps 4 --log "$work/sgd$ranks.jsonl" --save "$work/sgd$ranks.safetensors" \
    >"$work/sgd$ranks.out" 2>&1
  check "SGD token-mode run on $ranks ranks" $? "$(tail -5 "$work/sgd$ranks.out")"
done
"$python" "$work/compare.py" "$work/sgd2.jsonl" "$work/sgd1.jsonl" "$work/sgd2.safetensors" "$work/sgd1.safetensors" equal
check "token mode, SGD: 2 ranks x 2 give 1 process x 4's losses, norms and weights within 1e-6" $? "see above"

"$python" - "$work/ranks2.jsonl" 2 <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
# Rank 0's share of the global count differs from half in some step: the ranks' counts differ.
assert any(2 * l["rank_num_items_in_batch"] != l["num_items_in_batch"] for l in lines), "equal per-rank counts"
for line in lines:
    calls = line["communication"]
    assert line["replicas_identical"], f"step {line['step']}: replicas differ"
    assert (calls["count_all_reduces"], calls["gradient_all_reduces"], calls["value_all_reduces"]) == (1, 1, 1), \
        f"step {line['step']} with {sys.argv[2]} micro-batches: {calls}"
print("rank 0 / global targets per step: " + ", ".join(f"{l['rank_num_items_in_batch']}/{l['num_items_in_batch']}" for l in lines))
print(f"{len(lines)} steps, {sys.argv[2]} micro-batches: each 1 count, 1 gradient, 1 loss all-reduce "
      f"({lines[0]['communication']['backend_calls']} backend calls, {lines[0]['communication']['bytes_reduced']} bytes); "
      f"replicas identical, hashes {[l['replica_hash'] for l in lines]}")
PY
check "one count and one gradient all-reduce per step, replicas identical" $? "see above"

# 3. Mean mode (with 4 micro-batches per step): the per-rank mean weighs tokens unequally, so 2 ranks and one
#    process differ; still one reduction of each kind per step.
mpirun2 "$train_gpt" "${common[@]}" --loss-normalization mean --per-device-train-batch-size 2 \
  --gradient-accumulation-steps 4 --max-steps 3 --log "$work/mean2.jsonl" --save "$work/mean2.safetensors" \
  >"$work/mean2.out" 2>&1
check "2-rank mean-mode run" $? "$(tail -5 "$work/mean2.out")"
"$train_gpt" "${common[@]}" --loss-normalization mean --per-device-train-batch-size 4 --gradient-accumulation-steps 4 \
  --max-steps 3 --log "$work/mean1.jsonl" --save "$work/mean1.safetensors" >"$work/mean1.out" 2>&1
check "1-process mean-mode run" $? "$(tail -5 "$work/mean1.out")"
"$python" "$work/compare.py" "$work/mean2.jsonl" "$work/mean1.jsonl" "$work/mean2.safetensors" \
  "$work/mean1.safetensors" differ
check "mean mode: 2 ranks differ from 1 process" $? "see above"
"$python" - "$work/mean2.jsonl" 4 <<'PY'
import json, sys
for line in map(json.loads, open(sys.argv[1])):
    calls = line["communication"]
    assert (calls["count_all_reduces"], calls["gradient_all_reduces"]) == (1, 1), f"step {line['step']}: {calls}"
print(f"{sys.argv[2]} micro-batches per step: still 1 count and 1 gradient all-reduce per step")
PY
check "one reduction per step with 4 micro-batches" $? "see above"

# 4. Resume: 2 ranks save at step 2, resume to step 4: bitwise the straight 2-rank run. Then a 1-process
#    resume of that 2-rank state is refused, naming the world sizes.
mpirun2 "$train_gpt" "${common[@]}" --per-device-train-batch-size 2 --gradient-accumulation-steps 2 --max-steps 2 \
  --out "$work/state" >"$work/first.out" 2>&1
check "2-rank first half saves" $? "$(tail -5 "$work/first.out")"
mpirun2 "$train_gpt" "${common[@]}" --per-device-train-batch-size 2 --gradient-accumulation-steps 2 --max-steps 4 \
  --resume "$work/state" --log "$work/resumed.jsonl" --save "$work/resumed.safetensors" >"$work/resumed.out" 2>&1
check "2-rank second half resumes" $? "$(tail -5 "$work/resumed.out")"
"$python" - "$work/ranks2.jsonl" "$work/resumed.jsonl" <<'PY'
import json, sys
straight = {l["step"]: l["loss"] for l in map(json.loads, open(sys.argv[1]))}
resumed = {l["step"]: l["loss"] for l in map(json.loads, open(sys.argv[2]))}
assert sorted(resumed) == [3, 4], f"resumed steps {sorted(resumed)}"
for step, loss in resumed.items():
    assert loss == straight[step], f"step {step}: resumed {loss!r} != straight {straight[step]!r}"
print("resumed 2-rank losses equal the straight run's bitwise")
PY
check "2-rank resume: losses bitwise" $? "see above"
cmp -s "$work/resumed.safetensors" "$work/ranks2.safetensors"
check "2-rank resume: final weights bitwise" $? "the saved weights differ"
"$train_gpt" "${common[@]}" --per-device-train-batch-size 2 --gradient-accumulation-steps 2 --max-steps 4 \
  --resume "$work/state" >"$work/wrong_world.out" 2>&1
status=$?
[ "$status" -ne 0 ] && grep -q "saved by a run of 2 data-parallel ranks and this run has 1" "$work/wrong_world.out"
check "a resume with another world size is refused clearly" $? "exit $status: $(tail -2 "$work/wrong_world.out")"

# 4b. Saving under ZeRO-1 gathers the optimizer state one tensor at a time, in the file's order, through the
#     collectives' buffer, and streams it to the file: the account holds no gathered copy (the save adds 0 B), and the
#     save's and the resume's peaks are --plan's (planner::predict_state_phases) to the byte. The state resumes.
zero=("${common[@]}" --zero-stage 1 --per-device-train-batch-size 2)
mpirun2 "$train_gpt" "${zero[@]}" --max-steps 2 --out "$work/zero_state" >"$work/zero_save.out" 2>&1
check "2-rank ZeRO-1 run saving a training state" $? "$(tail -5 "$work/zero_save.out")"
grep -q "saved training state .* (device memory +0 B; " "$work/zero_save.out"
check "the ZeRO-1 save holds no gathered copy of the optimizer state" $? "$(grep saved "$work/zero_save.out")"
mpirun2 "$train_gpt" "${zero[@]}" --max-steps 3 --resume "$work/zero_state" >"$work/zero_resume.out" 2>&1
check "the ZeRO-1 state resumes" $? "$(tail -5 "$work/zero_resume.out")"
mpirun2 "$train_gpt" "${zero[@]}" --max-steps 3 --out "$work/zero_state" --resume "$work/zero_state" --plan \
  >"$work/zero_plan.out" 2>&1
predicted_save=$(sed -n 's/^save (--out, .*): peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/zero_plan.out")
predicted_resume=$(sed -n 's/^resume (--resume, .*): peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/zero_plan.out")
# Unanchored: mpirun forwards each rank's stdout and stderr apart, so a warning may share the line.
measured_save=$(grep -o 'saved training state [^ ]* (device memory +0 B; peak [0-9]* B)' "$work/zero_save.out" |
  sed 's/.*; peak \([0-9]*\) B)/\1/')
measured_resume=$(grep -o 'resumed from [^ ]* at step [0-9]* (peak [0-9]* B)' "$work/zero_resume.out" |
  sed 's/.*(peak \([0-9]*\) B)/\1/')
[ -n "$predicted_save" ] && [ "$measured_save" = "$predicted_save" ] && [ "$measured_resume" = "$predicted_resume" ]
check "ZeRO-1: the save's and the resume's peaks as --plan predicts ($predicted_save B, $predicted_resume B)" $? \
  "measured $measured_save B and $measured_resume B; $(grep -E '^(save|resume)' "$work/zero_plan.out")"

# 4c. The evaluation phase beside ZeRO-1's part of the optimizer state and its collective buffers: rank 0's measured peak
#     (eval_peak_total_bytes) is --plan's (planner::predict_evaluation_memory) to the byte.
evaluated=("${zero[@]}" --eval-data "$work/docs.txt" --eval-steps 2 --max-steps 2)
mpirun2 "$train_gpt" "${evaluated[@]}" --log "$work/zero_eval.jsonl" >"$work/zero_eval.out" 2>&1
check "2-rank ZeRO-1 run with --eval-data" $? "$(tail -5 "$work/zero_eval.out")"
mpirun2 "$train_gpt" "${evaluated[@]}" --plan >"$work/zero_eval_plan.out" 2>&1
predicted_eval=$(sed -n 's/^evaluation (.*): peak [^(]*(\([0-9]*\) B).*/\1/p' "$work/zero_eval_plan.out")
measured_eval=$(sed -n 's/.*"eval_peak_total_bytes":\([0-9]*\).*/\1/p' "$work/zero_eval.jsonl" | sort -u)
[ -n "$predicted_eval" ] && [ "$measured_eval" = "$predicted_eval" ]
check "ZeRO-1: the evaluation's peak as --plan predicts ($predicted_eval B)" $? \
  "measured $measured_eval; $(grep '^evaluation' "$work/zero_eval_plan.out")"

# 4d. --plan --world-size 2 plans for 2 ranks without launching them: the same report, word for word, as the 2
#     launched ranks' --plan.
mpirun2 "$train_gpt" "${evaluated[@]}" --out "$work/zero_state" --plan >"$work/launched_plan.out" 2>&1
"$train_gpt" "${evaluated[@]}" --out "$work/zero_state" --plan --world-size 2 >"$work/world_size_plan.out" 2>&1
cmp -s "$work/launched_plan.out" "$work/world_size_plan.out" && grep -q "ZeRO stage 1 over 2 ranks" "$work/world_size_plan.out"
check "--plan --world-size 2 is the 2 launched ranks' plan" $? "$(diff "$work/launched_plan.out" "$work/world_size_plan.out" | head -5)"

# 5. ZeRO stage 1: the same runs with each rank keeping the optimizer state of half the parameters. AdamW
#    against the unsharded 2-rank run (same sums, so the same weights), SGD against one process; the
#    optimizer-state peak per rank halves; one reduce-scatter and one all-gather per step.
for optimizer in adamw sgd; do
  mpirun2 "$train_gpt" "${common[@]}" --zero-stage 1 --optimizer $optimizer --per-device-train-batch-size 2 \
    --gradient-accumulation-steps 2 --max-steps 4 --check-replicas --log "$work/zero_$optimizer.jsonl" \
    --save "$work/zero_$optimizer.safetensors" >"$work/zero_$optimizer.out" 2>&1
  check "2-rank ZeRO-1 run ($optimizer)" $? "$(tail -5 "$work/zero_$optimizer.out")"
done
"$python" "$work/compare.py" "$work/zero_adamw.jsonl" "$work/ranks2.jsonl" "$work/zero_adamw.safetensors" \
  "$work/ranks2.safetensors" equal
check "ZeRO-1 AdamW equals the unsharded 2-rank run within 1e-6" $? "see above"
"$python" "$work/compare.py" "$work/zero_sgd.jsonl" "$work/sgd1.jsonl" "$work/zero_sgd.safetensors" \
  "$work/sgd1.safetensors" equal
check "ZeRO-1 SGD equals one process within 1e-6" $? "see above"
"$python" - "$work/zero_adamw.jsonl" "$work/ranks2.jsonl" <<'PY'
import json, sys
zero = [json.loads(l) for l in open(sys.argv[1])]
whole = [json.loads(l) for l in open(sys.argv[2])]
ratio = max(z["peak_mib"]["optimizer_state"] / w["peak_mib"]["optimizer_state"] for z, w in zip(zero, whole))
assert 0.49 <= ratio <= 0.51, f"optimizer state per rank is {ratio:.4f} of the unsharded run's"
for line in zero:
    calls = line["communication"]
    assert line["replicas_identical"], f"step {line['step']}: replicas differ"
    assert (calls["count_all_reduces"], calls["reduce_scatters"], calls["all_gathers"], calls["gradient_all_reduces"]) \
        == (1, 1, 1, 0), f"step {line['step']}: {calls}"
print(f"ZeRO-1 optimizer state per rank {zero[0]['peak_mib']['optimizer_state']:.4f} MiB against "
      f"{whole[0]['peak_mib']['optimizer_state']:.4f} MiB unsharded ({ratio:.4f}); per step {zero[0]['communication']}")
PY
check "ZeRO-1: half the optimizer state per rank, one reduce-scatter and one all-gather per step" $? "see above"
# ZeRO-1 resume: the state file holds the whole moments gathered from both ranks; each rank takes its part back.
mpirun2 "$train_gpt" "${common[@]}" --zero-stage 1 --per-device-train-batch-size 2 --gradient-accumulation-steps 2 \
  --max-steps 2 --out "$work/zero_state" >"$work/zero_first.out" 2>&1
check "2-rank ZeRO-1 first half saves" $? "$(tail -5 "$work/zero_first.out")"
mpirun2 "$train_gpt" "${common[@]}" --zero-stage 1 --per-device-train-batch-size 2 --gradient-accumulation-steps 2 \
  --max-steps 4 --resume "$work/zero_state" --log "$work/zero_resumed.jsonl" --save "$work/zero_resumed.safetensors" \
  >"$work/zero_resumed.out" 2>&1
check "2-rank ZeRO-1 second half resumes" $? "$(tail -5 "$work/zero_resumed.out")"
cmp -s "$work/zero_resumed.safetensors" "$work/zero_adamw.safetensors"
check "ZeRO-1 resume: final weights bitwise the straight ZeRO-1 run's" $? "the saved weights differ"
# The save in pieces: each optimizer tensor gathered a window of the 4 KiB buffer at a time, the same file byte for byte.
mpirun2 -x ENGINE_ZERO_BUCKET_BYTES=4096 "$train_gpt" "${common[@]}" --zero-stage 1 --per-device-train-batch-size 2 \
  --gradient-accumulation-steps 2 --max-steps 2 --out "$work/zero_pieces_state" >"$work/zero_pieces_first.out" 2>&1
check "2-rank ZeRO-1 first half saves in pieces" $? "$(tail -5 "$work/zero_pieces_first.out")"
cmp -s "$work/zero_pieces_state/state-000000000002.bin" "$work/zero_state/state-000000000002.bin"
check "ZeRO-1 in pieces: the training state file is the one-piece run's, byte for byte" $? "the state files differ"

# 5b. ZeRO-1's collectives move a piece of every rank's part at a time (distributed::ZeroPartition), so that their
#     buffers stay within a bucket whatever the model. The tiny model fits one piece of the default 32 MiB; with
#     ENGINE_ZERO_BUCKET_BYTES=4096 the same run takes 118 pieces: one reduce-scatter and one all-gather for each,
#     the same losses and weights bit for bit, replicas identical, and --plan's step peak equal to the measured one
#     (0.69 MiB of buffers become 6 KiB).
mpirun2 -x ENGINE_ZERO_BUCKET_BYTES=4096 "$train_gpt" "${common[@]}" --zero-stage 1 --per-device-train-batch-size 2 \
  --gradient-accumulation-steps 2 --max-steps 4 --check-replicas --log "$work/zero_pieces.jsonl" \
  --save "$work/zero_pieces.safetensors" >"$work/zero_pieces.out" 2>&1
check "2-rank ZeRO-1 run in pieces of 4 KiB" $? "$(tail -5 "$work/zero_pieces.out")"
cmp -s "$work/zero_pieces.safetensors" "$work/zero_adamw.safetensors"
check "ZeRO-1 in pieces: final weights bitwise the one-piece run's" $? "the saved weights differ"
pieces_predicted=$(ENGINE_ZERO_BUCKET_BYTES=4096 "$train_gpt" "${common[@]}" --zero-stage 1 --per-device-train-batch-size 2 \
  --gradient-accumulation-steps 2 --plan --world-size 2 2>&1 | sed -n 's/^  step peak [^(]*(\([0-9]*\) B.*/\1/p')
"$python" - "$work/zero_pieces.jsonl" "$work/zero_adamw.jsonl" "$pieces_predicted" <<'PY'
import json, sys
pieces = [json.loads(l) for l in open(sys.argv[1])]
whole = [json.loads(l) for l in open(sys.argv[2])]
assert len(pieces) == len(whole) == 4
for a, b in zip(pieces, whole):
    assert a["loss"] == b["loss"], f"step {a['step']}: loss {a['loss']!r} in pieces, {b['loss']!r} in one"
    assert a["replicas_identical"], f"step {a['step']}: replicas differ"
    calls = a["communication"]
    assert (calls["reduce_scatters"], calls["all_gathers"]) == (118, 118), f"step {a['step']}: {calls}"
    assert str(a["peak_total_bytes"]) == sys.argv[3], f"step {a['step']}: peak {a['peak_total_bytes']} B, --plan {sys.argv[3]} B"
print(f"ZeRO-1 in 118 pieces: losses bitwise, peak {pieces[0]['peak_total_bytes']} B as predicted "
      f"(one piece: {whole[0]['peak_total_bytes']} B)")
PY
check "ZeRO-1 in pieces: losses bitwise, 118 collectives of each kind a step, the peak as --plan predicts" $? "see above"

# 6. bf16 mixed precision with ZeRO-1 on 2 ranks: replicas stay bitwise identical (the f32 masters are
#    all-gathered, then each rank rounds them into its working copies alike), and the losses follow one
#    process's within 2^-10: the ranks' activations are those rows' own, and the summation order of the f32
#    gradients, which differs, can only flip a master's rounding to bf16 by one ulp here and there.
mpirun2 "$train_gpt" "${common[@]}" --precision bf16 --zero-stage 1 --per-device-train-batch-size 2 \
  --gradient-accumulation-steps 2 --max-steps 4 --check-replicas --log "$work/bf16_zero.jsonl" >"$work/bf16_zero.out" 2>&1
check "2-rank bf16 ZeRO-1 run" $? "$(tail -5 "$work/bf16_zero.out")"
"$train_gpt" "${common[@]}" --precision bf16 --per-device-train-batch-size 2 --gradient-accumulation-steps 4 \
  --max-steps 4 --log "$work/bf16_one.jsonl" >"$work/bf16_one.out" 2>&1
check "1-process bf16 run" $? "$(tail -5 "$work/bf16_one.out")"
"$python" - "$work/bf16_zero.jsonl" "$work/bf16_one.jsonl" <<'PY'
import json, sys
ranks = [json.loads(l) for l in open(sys.argv[1])]
one = [json.loads(l) for l in open(sys.argv[2])]
assert len(ranks) == len(one) == 4
for a, b in zip(ranks, one):
    assert a["replicas_identical"], f"step {a['step']}: replicas differ"
    relative = abs(a["loss"] / b["loss"] - 1)
    assert relative <= 2 ** -10, f"step {a['step']}: 2 ranks {a['loss']} vs one process {b['loss']}"
print("bf16 ZeRO-1, 2 ranks: replicas identical, losses", [round(a["loss"], 6) for a in ranks], "vs",
      [round(b["loss"], 6) for b in one])
PY
check "bf16 ZeRO-1 on 2 ranks: identical replicas, one process's losses within 2^-10" $? "see above"

# 7. --eval-data on 2 ranks: each rank evaluates its part of every eval batch and Trainer::evaluate sums the
#    losses and the counts over the ranks. Padded held-out documents, so the ranks' target counts differ and a
#    mean of per-rank means would be wrong: the eval loss must be one process x 4's within 1e-6 (the float sums
#    group the rows differently), with the same count; training stays bitwise the 2-rank run without it, and
#    each step's communication counters still show the step's own reductions only.
"$python" - "$work/held_out.txt" <<'PY'
import random, sys
random.seed(11)
letters = "abcdefghij klmnop"
with open(sys.argv[1], "w") as out:
    for _ in range(64):
        out.write("".join(random.choice(letters) for _ in range(random.randint(2, 79))) + "\n")
PY
evaluation=(--eval-data "$work/held_out.txt" --eval-steps 3 --eval-every 2)
mpirun2 "$train_gpt" "${common[@]}" "${evaluation[@]}" --per-device-train-batch-size 2 --gradient-accumulation-steps 2 \
  --max-steps 4 --check-replicas --log "$work/eval2.jsonl" >"$work/eval2.out" 2>&1
check "2-rank run with --eval-data" $? "$(tail -5 "$work/eval2.out")"
"$train_gpt" "${common[@]}" "${evaluation[@]}" --per-device-train-batch-size 4 --gradient-accumulation-steps 2 \
  --max-steps 4 --log "$work/eval1.jsonl" >"$work/eval1.out" 2>&1
check "1-process run with --eval-data" $? "$(tail -5 "$work/eval1.out")"
[ "$(grep -c '^eval step' "$work/eval2.out")" -eq 2 ]
check "only rank 0 prints the eval lines" $? "$(grep '^eval step' "$work/eval2.out")"
"$python" - "$work/eval2.jsonl" "$work/ranks2.jsonl" "$work/eval1.jsonl" <<'PY'
import json, sys
evaluated, plain, one = ([json.loads(l) for l in open(path)] for path in sys.argv[1:4])
for a, b in zip(evaluated, plain):
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], f"step {a['step']}: training changed"
    calls = a["communication"]
    assert (calls["count_all_reduces"], calls["gradient_all_reduces"], calls["value_all_reduces"]) == (1, 1, 1), calls
pairs = [(a, b) for a, b in zip(evaluated, one) if "eval_loss" in a]
assert [a["step"] for a, _ in pairs] == [2, 4] and all("eval_loss" in b for _, b in pairs)
for a, b in pairs:
    assert a["eval_num_items"] == b["eval_num_items"], (a["eval_num_items"], b["eval_num_items"])
    relative = abs(a["eval_loss"] / b["eval_loss"] - 1)
    assert relative <= 1e-6, f"step {a['step']}: 2 ranks {a['eval_loss']!r} vs one process {b['eval_loss']!r}"
print("eval on 2 ranks (2 ranks, 1 process, targets):",
      [(a["eval_loss"], b["eval_loss"], a["eval_num_items"]) for a, b in pairs])
PY
check "2-rank eval loss is one process's; training unchanged" $? "see above"

# A rank that fails while the other waits in a collective (rank 1 alone runs out of its --memory-limit in its first
# forward; rank 0 is in the step's reductions): the failing rank says why and exits without MPI_Finalize, which
# would wait for rank 0, so mpirun ends the job instead of both hanging until the test's timeout.
start=$SECONDS
timeout 120 "$mpiexec" --oversubscribe -np 1 "$train_gpt" "${common[@]}" --max-steps 3 : \
  -np 1 "$train_gpt" "${common[@]}" --max-steps 3 --memory-limit 3000000 >"$work/one_fails.out" 2>&1
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] && grep -q "train_gpt: error: out of memory" "$work/one_fails.out"
ended=$?
check "one rank's failure ends the job (exit $status after $((SECONDS - start)) s) instead of hanging" $ended \
  "$(tail -5 "$work/one_fails.out")"

echo "$((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
