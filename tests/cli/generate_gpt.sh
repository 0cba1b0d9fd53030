#!/usr/bin/env bash
# ctest generate_gpt: sampling from a checkpoint train_gpt --save wrote. It exits 0 and prints the prompt and
# its continuation; a seed gives the same text twice; greedy and --top-k 1 agree; bad flags give one stderr
# line naming the flag, exit 2 and nothing on stdout; a Llama directory with a tokenizer.json samples text.
# usage: generate_gpt.sh TRAIN_GPT GENERATE_GPT WORK_DIR DATA_DIR
set -u
train_gpt=$1
generate_gpt=$2
work=$3
data=$4
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}

# A tiny model (bytes, 64 positions, 2 layers, 4 heads, width 64) trained for 20 steps on the built-in corpus.
"$train_gpt" --max-steps 20 --save "$work/tiny.safetensors" >"$work/train.out" 2>&1
check "train_gpt --save" $? "$(tail -3 "$work/train.out")"
model=(--checkpoint "$work/tiny.safetensors" --n-head 4)

"$generate_gpt" "${model[@]}" --prompt "The " --max-new-tokens 40 --seed 7 >"$work/a.out" 2>"$work/a.err"
check "generate_gpt exits 0" $? "$(cat "$work/a.err")"
head -c 4 "$work/a.out" | grep -q "^The " && [ "$(head -c 44 "$work/a.out" | wc -c)" -eq 44 ]
check "prints the prompt and 40 new bytes" $? "$(cat "$work/a.out")"
"$generate_gpt" "${model[@]}" --prompt "The " --max-new-tokens 40 --seed 7 >"$work/b.out" 2>/dev/null
cmp -s "$work/a.out" "$work/b.out"
check "the same seed gives the same text" $? "$(cat "$work/a.out") vs $(cat "$work/b.out")"
"$generate_gpt" "${model[@]}" --prompt "The " --max-new-tokens 40 --temperature 0 >"$work/greedy.out" 2>/dev/null
check "greedy exits 0" $? ""
"$generate_gpt" "${model[@]}" --prompt "The " --max-new-tokens 40 --top-k 1 --seed 3 >"$work/top1.out" 2>/dev/null
cmp -s "$work/greedy.out" "$work/top1.out"
check "--top-k 1 equals --temperature 0" $? "$(cat "$work/greedy.out") vs $(cat "$work/top1.out")"

"$generate_gpt" "${model[@]}" >"$work/default.out" 2>/dev/null
check "the defaults fill the model's 64 positions" $? ""
[ "$(wc -c <"$work/default.out")" -eq 65 ] # a newline prompt, 63 bytes, the closing newline
check "default output length" $? "$(wc -c <"$work/default.out") bytes"

# A vocabulary other than bytes (300: the built-in corpus fits, ids 256..299 unused): ids in, ids out.
"$train_gpt" --vocab-size 300 --max-seq-len 16 --n-layer 1 --max-steps 2 --save "$work/ids.safetensors" \
  >"$work/train_ids.out" 2>&1
check "train_gpt --vocab-size 300 --save" $? "$(tail -3 "$work/train_ids.out")"
"$generate_gpt" --checkpoint "$work/ids.safetensors" --n-head 4 --prompt 1,299,7 --max-new-tokens 5 \
  >"$work/ids.out" 2>"$work/ids.err"
check "token ids exit 0" $? "$(cat "$work/ids.err")"
grep -Eq '^1,299,7(,[0-9]+){5}$' "$work/ids.out"
check "token ids print the prompt and 5 ids" $? "$(cat "$work/ids.out")"
expect_ids=(--checkpoint "$work/ids.safetensors" --n-head 4)

# expect FLAG ARGS...: generate_gpt ARGS must fail with exit 2 and one line naming FLAG.
expect() {
  local flag=$1
  shift
  total=$((total + 1))
  "$generate_gpt" "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  local lines
  lines=$(wc -l <"$work/stderr")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$flag" "$work/stderr" || [ -s "$work/stdout" ]; then
    echo "FAIL: generate_gpt $* -> exit $rc, $lines stderr lines: $(head -c 300 "$work/stderr")"
    failures=$((failures + 1))
  else
    echo "ok: generate_gpt $* -> $(cat "$work/stderr")"
  fi
}
printf 'abc' >"$work/not_safetensors.bin"
expect --checkpoint --n-head 4
expect --checkpoint --checkpoint "$work/no_such.safetensors" --n-head 4
expect --checkpoint --checkpoint "$work/not_safetensors.bin" --n-head 4
expect --n-head --checkpoint "$work/tiny.safetensors"
expect --n-head --checkpoint "$work/tiny.safetensors" --n-head 5
expect --temperature "${model[@]}" --temperature -1
expect --temperature "${model[@]}" --temperature hot
expect --top-k "${model[@]}" --top-k 257
expect --max-new-tokens "${model[@]}" --max-new-tokens 0
expect --max-new-tokens "${model[@]}" --prompt "0123456789" --max-new-tokens 60
expect --prompt "${model[@]}" --prompt ""
expect --prompt "${model[@]}" --prompt "$(printf '%064d' 0)"
expect --seed "${model[@]}" --seed -2
expect --device "${model[@]}" --device tpu
expect --frobnicate "${model[@]}" --frobnicate 1
expect --prompt "${expect_ids[@]}" --prompt 1,300
expect --prompt "${expect_ids[@]}" --prompt 1,x
expect --max-new-tokens "${expect_ids[@]}" --prompt 1,2 --max-new-tokens 15

# A model directory (train_gpt --save DIR): its config.json gives the head count, so --n-head is not needed,
# and the same weights sample the same text as the file.
"$train_gpt" --max-steps 20 --save "$work/tiny_dir" >"$work/train_dir.out" 2>&1
check "train_gpt --save DIR" $? "$(tail -3 "$work/train_dir.out")"
"$generate_gpt" --checkpoint "$work/tiny_dir" --prompt "The " --max-new-tokens 40 --seed 7 >"$work/dir.out" 2>"$work/dir.err"
check "generate_gpt --checkpoint DIR exits 0" $? "$(cat "$work/dir.err")"
cmp -s "$work/a.out" "$work/dir.out"
check "the directory samples what the file does" $? "$(cat "$work/a.out") vs $(cat "$work/dir.out")"
expect --n-head --checkpoint "$work/tiny_dir" --n-head 4

# A Llama directory with a tokenizer.json (a byte-level BPE of 555 ids, tests/data/tokenizers): the prompt is text,
# encoded as tokenizers encodes it (its ids are the golden file's), and the output decoded; a seed reproduces it.
"$train_gpt" --model llama-tiny --vocab-size 600 --max-steps 2 --save "$work/llama_dir" >/dev/null 2>&1
check "train_gpt --save a Llama DIR" $? ""
cp "$data/tokenizers/llama3_style/tokenizer.json" "$work/llama_dir/"
"$generate_gpt" --checkpoint "$work/llama_dir" --prompt "Hello world" --max-new-tokens 8 --seed 3 >"$work/llama.out" 2>"$work/llama.err"
check "generate_gpt samples a Llama directory" $? "$(cat "$work/llama.err")"
head -c 11 "$work/llama.out" | grep -q "^Hello world"
check "its text starts with the prompt" $? "$(cat "$work/llama.out")"
"$generate_gpt" --checkpoint "$work/llama_dir" --prompt "Hello world" --max-new-tokens 8 --seed 3 >"$work/llama2.out" 2>/dev/null
cmp -s "$work/llama.out" "$work/llama2.out"
check "the same seed gives the same Llama text" $? "$(cat "$work/llama.out") vs $(cat "$work/llama2.out")"
"$generate_gpt" --checkpoint "$work/llama_dir" --prompt "Hello world" --max-new-tokens 8 --seed 3 --ids >"$work/ids.out" 2>/dev/null
/usr/bin/python3 - "$data/tokenizers/cases.json" "$work/ids.out" <<'PY'
import json, sys
expected = dict((text, ids) for text, ids in json.load(open(sys.argv[1], encoding="utf-8"))["llama3_style"])["Hello world"]
printed = [int(i) for i in open(sys.argv[2]).read().strip().split(",")]
assert printed[:len(expected)] == expected and len(printed) == len(expected) + 8, (printed, expected)
PY
check "--ids: the prompt's ids are tokenizers' own, then 8 more" $? "$(cat "$work/ids.out")"
expect --prompt --checkpoint "$work/llama_dir" --prompt "$(printf 'caf\xe9')"
expect --ids --checkpoint "$work/tiny_dir" --ids
cp "$data/tokenizers/llama3_style/tokenizer.json" "$work/tiny_dir/"
printf '{ not json' >"$work/tiny_dir/tokenizer.json"
expect --checkpoint --checkpoint "$work/tiny_dir"

echo "$((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
