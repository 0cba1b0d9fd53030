#!/usr/bin/env bash
# ctest train_gpt_runs: the main job as a user runs it. With no flags its loss falls; --log writes one JSON
# line per step with the printed fields; --plan predicts without training; a run saved at step 3 and
# resumed gives bitwise the losses of an uninterrupted run; --profile prints and logs the op table; the
# streaming LM head's chunks train as the whole logits do, and so do the tiled MLP's tiles.
# usage: train_gpt_runs.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
python=$(command -v python3 || command -v /usr/bin/python3 || echo python3) # only json and sys are used
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}

# 1. No flags but --log: the defaults train the tiny GPT on the built-in corpus and the loss falls.
"$train_gpt" --log "$work/default.jsonl" >"$work/default.out" 2>&1
check "default run exits 0" $? "$(tail -3 "$work/default.out")"
"$python" - "$work/default.jsonl" <<'PY'
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
assert len(lines) == 40, f"{len(lines)} JSON lines for 40 steps"
for line in lines:
    for key in ("step", "loss", "lr", "grad_norm", "tokens_per_second", "peak_mib", "peak_total_mib"):
        assert key in line, f"missing {key}"
    for category in ("parameters", "gradients", "optimizer_state", "activations", "workspace", "pinned_host"):
        assert category in line["peak_mib"], f"missing peak_mib.{category}"
first = sum(l["loss"] for l in lines[:5]) / 5
last = sum(l["loss"] for l in lines[-5:]) / 5
assert last < 0.8 * first, f"loss did not fall: first five {first:.4f}, last five {last:.4f}"
print(f"loss {first:.4f} -> {last:.4f}")
PY
check "default run's loss falls and --log has every field" $? "see above"
grep -q "first loss .* -> last loss" "$work/default.out"
check "default run prints its summary" $? "$(tail -2 "$work/default.out")"

# 2. --plan prints the predicted categories and trains nothing.
"$train_gpt" --gradient-checkpointing --every-n-layers 2 --plan >"$work/plan.out" 2>&1
status=$?
! grep -q "^step " "$work/plan.out" && grep -q "activations" "$work/plan.out" && grep -q "optimizer" "$work/plan.out"
check "--plan predicts without training" $((status | $?)) "$(head -5 "$work/plan.out")"

# 3. Save at step 3 and resume to step 6 equals 6 straight steps, loss for loss (constant lr, so that
#    --max-steps does not change the schedule).
common=(--lr-scheduler-type constant --gradient-accumulation-steps 2 --gradient-checkpointing --model tiny)
"$train_gpt" "${common[@]}" --max-steps 6 --log "$work/straight.jsonl" >"$work/straight.out" 2>&1
check "straight run" $? "$(tail -2 "$work/straight.out")"
"$train_gpt" "${common[@]}" --max-steps 3 --out "$work/state" --save-every 3 >"$work/first.out" 2>&1
check "first half saves" $? "$(tail -2 "$work/first.out")"
"$train_gpt" "${common[@]}" --max-steps 6 --resume "$work/state" --log "$work/resumed.jsonl" >"$work/resumed.out" 2>&1
check "second half resumes" $? "$(tail -2 "$work/resumed.out")"
"$python" - "$work/straight.jsonl" "$work/resumed.jsonl" <<'PY'
import json, sys
straight = {l["step"]: l["loss"] for l in map(json.loads, open(sys.argv[1]))}
resumed = {l["step"]: l["loss"] for l in map(json.loads, open(sys.argv[2]))}
assert sorted(resumed) == [4, 5, 6], f"resumed steps {sorted(resumed)}"
for step, loss in resumed.items():
    assert loss == straight[step], f"step {step}: resumed {loss!r} != straight {straight[step]!r}"
print("resumed losses equal the straight run's bitwise")
PY
check "resume is bitwise the straight run" $? "see above"

# --profile: the table after training (steps 3-4: the first two warm up) and "profile" on the last log line only.
"$train_gpt" --max-steps 4 --profile --log "$work/profile.jsonl" >"$work/profile.out" 2>&1
check "--profile run exits 0" $? "$(tail -2 "$work/profile.out")"
grep -q "^op profile (CPU kernels) over 2 steps, the first 2 left out" "$work/profile.out" &&
  grep -q "^GEMM share: " "$work/profile.out"
check "--profile prints the table and the GEMM share" $? "$(tail -5 "$work/profile.out")"
"$python" - "$work/profile.jsonl" <<'PY'
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
assert all("profile" not in line for line in lines[:-1]), "profile before the last line"
profile = lines[-1]["profile"]
assert profile["steps"] == 2 and profile["warmup_steps_excluded"] == 2, profile
assert 0 < profile["profiled_seconds"] <= profile["step_seconds"], profile
assert 0 < profile["gemm_share_of_step"] < 1, profile
ops = {(op["op"], op["phase"]) for op in profile["ops"]}
for expected in [("linear", "forward"), ("linear", "backward"), ("adamw", "optimizer")]:
    assert expected in ops, f"{expected} missing from {sorted(ops)}"
print(f"GEMM share {profile['gemm_share_of_step']:.2f}")
PY
check "--log's last line carries the profile" $? "see above"

# --loss-chunk-tokens: the default (auto) on the tiny model is one chunk of the micro-batch's 8 x 64 tokens,
# bitwise the whole logits (off); chunks of 100 (the last 12) train to the same losses up to rounding; --plan
# names the chunk and what it saves.
for chunks in off 512 100; do
  "$train_gpt" --max-steps 4 --loss-chunk-tokens "$chunks" --log "$work/chunks_$chunks.jsonl" >"$work/chunks_$chunks.out" 2>&1
  check "--loss-chunk-tokens $chunks run exits 0" $? "$(tail -2 "$work/chunks_$chunks.out")"
done
"$python" - "$work/chunks_off.jsonl" "$work/chunks_512.jsonl" "$work/chunks_100.jsonl" <<'PY'
import json, sys
off, one, small = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:])
assert one == off, f"one chunk {one} != whole logits {off}"
assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(small, off)), f"chunks of 100 {small} vs {off}"
print(f"losses {off[-1]:.6f} (off) {one[-1]:.6f} (one chunk) {small[-1]:.6f} (chunks of 100)")
PY
check "one chunk is bitwise the whole logits; small chunks agree" $? "see above"
"$train_gpt" --loss-chunk-tokens 100 --plan >"$work/chunks_plan.out" 2>&1 &&
  grep -q "^loss: streaming head, 6 chunks of 100 tokens" "$work/chunks_plan.out"
check "--plan names the loss chunks" $? "$(grep loss: "$work/chunks_plan.out")"

# --mlp-tile-tokens: the default (auto) on the tiny model is off (its MLP intermediates are far below 64 MiB);
# one tile of all 8 x 64 tokens trains bitwise as off, tiles of 100 (the last 12) to the same losses up to
# rounding; --plan names the tile and what it saves.
for tiles in off 512 100; do
  "$train_gpt" --max-steps 4 --mlp-tile-tokens "$tiles" --log "$work/tiles_$tiles.jsonl" >"$work/tiles_$tiles.out" 2>&1
  check "--mlp-tile-tokens $tiles run exits 0" $? "$(tail -2 "$work/tiles_$tiles.out")"
done
"$python" - "$work/tiles_off.jsonl" "$work/tiles_512.jsonl" "$work/tiles_100.jsonl" "$work/chunks_off.jsonl" <<'PY'
import json, sys
off, one, small, default = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:])
assert off == default, f"--mlp-tile-tokens off {off} != the default (auto: off here) {default}"
assert one == off, f"one tile {one} != the whole MLP {off}"
assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(small, off)), f"tiles of 100 {small} vs {off}"
print(f"losses {off[-1]:.6f} (off) {one[-1]:.6f} (one tile) {small[-1]:.6f} (tiles of 100)")
PY
check "one MLP tile is bitwise the whole MLP; small tiles agree" $? "see above"
"$train_gpt" --mlp-tile-tokens 100 --plan >"$work/tiles_plan.out" 2>&1 &&
  grep -q "^MLP: tiled, 6 tiles of 100 tokens" "$work/tiles_plan.out"
check "--plan names the MLP tiles" $? "$(grep MLP: "$work/tiles_plan.out")"

echo "$((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
