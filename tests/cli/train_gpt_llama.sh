#!/usr/bin/env bash
# ctest train_gpt_llama: Llama through the main job. llama-tiny's loss falls on the built-in corpus; --init DIR
# (transformers' own directory) trains and --save DIR writes a directory whose weights train_gpt reads back;
# a run saved and resumed with checkpointing and offload gives the straight run's losses bitwise; --plan knows
# smollm-135m; bad flags name themselves. usage: train_gpt_llama.sh TRAIN_GPT DATA_DIR WORK_DIR
set -u
train_gpt=$1
data=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
python=$(command -v python3 || command -v /usr/bin/python3 || echo python3) # only json and sys are used
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}
losses() { "$python" -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"; }

# 1. llama-tiny on the built-in corpus: the loss falls.
"$train_gpt" --model llama-tiny --max-steps 30 --log "$work/tiny.jsonl" >"$work/tiny.out" 2>&1
check "llama-tiny trains" $? "$(tail -3 "$work/tiny.out")"
"$python" - "$work/tiny.jsonl" <<'PY'
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
assert len(lines) == 30, f"{len(lines)} lines"
first = sum(l["loss"] for l in lines[:5]) / 5
last = sum(l["loss"] for l in lines[-5:]) / 5
assert last < 0.8 * first, f"loss did not fall: {first:.4f} -> {last:.4f}"
print(f"llama-tiny loss {first:.4f} -> {last:.4f}")
PY
check "llama-tiny's loss falls" $? "see above"
grep -q "llama: vocab 256" "$work/tiny.out"
check "the model line names the architecture" $? "$(head -2 "$work/tiny.out")"

# 2. transformers' directory in, a directory out, and that directory back in. Its vocabulary is 64 ids: an llm.c
# token shard of ids < 64 (magic, version, count, then uint16 ids).
"$python" - "$work/train.bin" <<'PY'
import random, struct, sys
random.seed(5)
ids = [random.randrange(64) for _ in range(4096)]
with open(sys.argv[1], "wb") as file:
    file.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)))
    file.write(struct.pack(f"<{len(ids)}H", *ids))
PY
"$train_gpt" --init "$data/hf_llama_tiny" 2>&1 | grep -q "error: --data"
check "--init DIR without --data names --data (the built-in corpus needs 256 ids)" $? "see train_gpt's output"
"$train_gpt" --init "$data/hf_llama_tiny" --data "$work/train.bin" --max-steps 4 --seq-len 16 --per-device-train-batch-size 2 \
  --save "$work/finetuned" >"$work/init.out" 2>&1
check "--init DIR trains a transformers Llama" $? "$(tail -3 "$work/init.out")"
for file in config.json model.safetensors generation_config.json; do
  test -f "$work/finetuned/$file"
  check "--save DIR wrote $file" $? "$(ls "$work/finetuned" 2>&1)"
done
"$train_gpt" --init "$work/finetuned" --data "$work/train.bin" --max-steps 1 --seq-len 16 --per-device-train-batch-size 2 >"$work/reinit.out" 2>&1
check "the saved directory is a valid --init" $? "$(tail -3 "$work/reinit.out")"
"$train_gpt" --init "$data/hf_llama_tiny" --data "$work/train.bin" --data-layout padded --max-steps 1 --seq-len 16 \
  --per-device-train-batch-size 2 >"$work/padded.out" 2>&1
grep -q "(end of text 2)" "$work/padded.out"
check "--data-layout padded splits at the directory's eos_token_id" $? "$(grep data: "$work/padded.out")"
"$train_gpt" --init "$data/hf_llama_tiny" --data "$work/train.bin" --data-layout packed-documents --max-steps 3 \
  --seq-len 16 --per-device-train-batch-size 2 --gradient-checkpointing --log "$work/documents.jsonl" \
  >"$work/documents.out" 2>&1
check "--data-layout packed-documents trains" $? "$(tail -3 "$work/documents.out")"
grep -q "rows of documents packed into 16 tokens (end of text 2)" "$work/documents.out"
check "--data-layout packed-documents packs the documents split at eos_token_id" $? "$(grep data: "$work/documents.out")"
test "$(wc -l <"$work/documents.jsonl")" -eq 3
check "--data-layout packed-documents logs every step" $? "$(cat "$work/documents.jsonl")"
"$train_gpt" --init "$data/hf_llama_tiny" --data-layout packed-documents --seq-len 16 --plan >"$work/documents_plan.out" 2>&1
check "--plan with --data-layout packed-documents" $? "$(tail -3 "$work/documents_plan.out")"
"$train_gpt" --model llama-tiny --data-layout packed-document --max-steps 1 >"$work/bad_layout.out" 2>&1
test $? -eq 2 && grep -q "packed, padded, packed-documents" "$work/bad_layout.out"
check "an unknown --data-layout names the three" $? "$(cat "$work/bad_layout.out")"
"$train_gpt" --init "$data/hf_llama_tiny" --data "$work/train.bin" --data-layout padded --max-tokens-per-micro-batch 40 \
  --max-steps 2 --seq-len 16 --per-device-train-batch-size 4 >"$work/budget.out" 2>&1
check "--max-tokens-per-micro-batch trains" $? "$(tail -3 "$work/budget.out")"
grep -q "at most 40 tokens a micro-batch" "$work/budget.out"
check "--max-tokens-per-micro-batch is named on the data line" $? "$(grep data: "$work/budget.out")"
"$train_gpt" --init "$data/hf_llama_tiny" --data-layout padded --max-tokens-per-micro-batch 40 --seq-len 16 --per-device-train-batch-size 4 \
  --plan >"$work/budget_plan.out" 2>&1
grep -q "token budget 40 per micro-batch: planned for its worst, 4 x 10 tokens" "$work/budget_plan.out" &&
  grep -q "micro-batch 4 x 10 tokens" "$work/budget_plan.out"
check "--plan with a token budget plans its worst micro-batch" $? "$(head -3 "$work/budget_plan.out")"
"$train_gpt" --model llama-tiny --max-tokens-per-micro-batch 8 --seq-len 16 --max-steps 1 >"$work/budget_bad.out" 2>&1
test $? -eq 2 && grep -q "error: --max-tokens-per-micro-batch: 8 is below one sequence of --seq-len 16" "$work/budget_bad.out"
check "a token budget below one sequence is refused" $? "$(cat "$work/budget_bad.out")"
"$train_gpt" --model llama-tiny --max-tokens-per-micro-batch 64 --max-memory 1GiB --max-steps 1 >"$work/budget_planned.out" 2>&1
test $? -eq 2 && grep -q "error: --max-tokens-per-micro-batch: the planner chooses" "$work/budget_planned.out"
check "a token budget with --max-memory is refused" $? "$(cat "$work/budget_planned.out")"
"$train_gpt" --init "$data/hf_llama_tiny_sharded" --data "$work/train.bin" --max-steps 1 --seq-len 16 --per-device-train-batch-size 2 \
  >"$work/sharded.out" 2>&1
check "--init reads a sharded directory" $? "$(tail -3 "$work/sharded.out")"

# 2b. A vocabulary past 65536 (Llama-3's is 128256): llm.c's uint32 shard (magic 20240801, version 7), ids drawn
# across the whole vocabulary so that most are at or above 65536; the run trains and the loss falls on a repeated
# stretch; an id past the vocabulary is refused naming --data, the file and the offset.
"$python" - "$work/wide.bin" "$work/wide_bad.bin" <<'PY'
import random, struct, sys
random.seed(6)
ids = [random.randrange(70000) for _ in range(64)] * 64
assert sum(i >= 65536 for i in ids) > 0
for path, stream in ((sys.argv[1], ids), (sys.argv[2], ids[:100] + [70000] + ids[100:200])):
    with open(path, "wb") as file:
        file.write(struct.pack("<256i", *([20240801, 7, len(stream)] + [0] * 253)))
        file.write(struct.pack(f"<{len(stream)}I", *stream))
PY
"$train_gpt" --model llama-tiny --vocab-size 70000 --data "$work/wide.bin" --seq-len 64 --per-device-train-batch-size 2 \
  --max-steps 12 --learning-rate 3e-3 --log "$work/wide.jsonl" >"$work/wide.out" 2>&1
check "a vocabulary of 70000 trains from a uint32 shard" $? "$(tail -3 "$work/wide.out")"
"$python" - "$work/wide.jsonl" <<'PY'
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
assert len(lines) == 12, f"{len(lines)} lines"
print(f"vocabulary 70000 from uint32 ids: loss {lines[0]['loss']:.4f} -> {lines[-1]['loss']:.4f}")
assert lines[-1]["loss"] < lines[0]["loss"] - 0.5, "the loss did not fall on the repeated stretch"
PY
check "its loss falls" $? "see above"
"$train_gpt" --model llama-tiny --vocab-size 70000 --data "$work/wide_bad.bin" --seq-len 16 --max-steps 1 \
  >"$work/wide_bad.out" 2>"$work/wide_bad.err"
[ $? -eq 2 ] && grep -q -- "--data" "$work/wide_bad.err" && grep -q "token id 70000 at token index 100 (byte offset 1424)" "$work/wide_bad.err"
check "an id past the vocabulary in a uint32 shard names --data and its offset" $? "$(cat "$work/wide_bad.err")"

# 3. Save at step 3 and resume to 6 with checkpointing and offload: the straight run's losses bitwise.
# (a constant schedule: a cosine one would end at each half's own --max-steps)
common=(--model llama-tiny --lr-scheduler-type constant --gradient-checkpointing --every-n-layers 2 --offload)
"$train_gpt" "${common[@]}" --max-steps 6 --log "$work/straight.jsonl" >"$work/straight.out" 2>&1
check "straight run" $? "$(tail -3 "$work/straight.out")"
"$train_gpt" "${common[@]}" --max-steps 3 --out "$work/state" --log "$work/first.jsonl" >"$work/first.out" 2>&1
check "first half" $? "$(tail -3 "$work/first.out")"
"$train_gpt" "${common[@]}" --max-steps 6 --resume "$work/state" --log "$work/second.jsonl" >"$work/second.out" 2>&1
check "resumed half" $? "$(tail -3 "$work/second.out")"
straight=$(losses "$work/straight.jsonl")
resumed="$(losses "$work/first.jsonl") $(losses "$work/second.jsonl")"
[ "$straight" = "$resumed" ]
check "resumed losses equal the straight run's bitwise" $? "straight: $straight; resumed: $resumed"

# 4. --plan for SmolLM-135M at T=2048.
"$train_gpt" --model smollm-135m --seq-len 2048 --per-device-train-batch-size 1 --gradient-accumulation-steps 1 \
  --plan >"$work/plan.out" 2>&1
check "--plan smollm-135m" $? "$(tail -3 "$work/plan.out")"
grep -q "llama" "$work/plan.out"
check "--plan names the Llama model" $? "$(head -3 "$work/plan.out")"

# 5. Bad flags: one line naming the flag, exit 2.
expect_usage() { # NAME FLAG ARGS...
  local name=$1 flag=$2
  shift 2
  "$train_gpt" "$@" >"$work/bad.out" 2>&1
  local status=$?
  [ $status -eq 2 ] && grep -q -- "error: $flag" "$work/bad.out"
  check "$name" $? "exit $status: $(cat "$work/bad.out")"
}
expect_usage "--model with --init DIR" --model --init "$data/hf_llama_tiny" --model llama-tiny
expect_usage "--n-head with --init DIR" --n-head --init "$data/hf_llama_tiny" --n-head 2
expect_usage "--n-kv-head on GPT-2" --n-kv-head --model tiny --n-kv-head 2
expect_usage "--dropout on Llama" --dropout --model llama-tiny --dropout 0.1
expect_usage "--n-kv-head not dividing the heads" --n-kv-head --model llama-tiny --n-kv-head 3
mkdir -p "$work/qwen" && printf '{"model_type": "qwen2"}' >"$work/qwen/config.json"
expect_usage "unsupported model_type" --init --init "$work/qwen"
expect_usage "--save naming an existing file as a directory" --save --model llama-tiny --save "$work/train.bin"
mkdir -p "$work/directory.safetensors"
expect_usage "--save FILE.safetensors naming a directory" --save --model llama-tiny --save "$work/directory.safetensors"

echo "$((total - failures)) passed, $failures failed"
[ $failures -eq 0 ]
