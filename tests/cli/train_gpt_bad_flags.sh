#!/usr/bin/env bash
# ctest train_gpt_bad_flags: every bad flag gets exactly one stderr line naming the flag, exit code 2, no
# stack trace, and nothing on stdout. usage: train_gpt_bad_flags.sh TRAIN_GPT WORK_DIR
set -u
train_gpt=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
printf 'abc' >"$work/not_a_shard.bin"
printf '\xff' >"$work/high_byte.txt"
failures=0
total=0

# expect FLAG ARGS...: train_gpt ARGS must fail with exit 2 and one line naming FLAG.
expect() {
  local flag=$1
  shift
  total=$((total + 1))
  "$train_gpt" "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  local lines
  lines=$(wc -l <"$work/stderr")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$flag" "$work/stderr" || [ -s "$work/stdout" ]; then
    echo "FAIL: train_gpt $* -> exit $rc, $lines stderr lines: $(head -c 300 "$work/stderr")"
    failures=$((failures + 1))
  else
    echo "ok: train_gpt $* -> $(cat "$work/stderr")"
  fi
}

expect --per-device-train-batch-size --per-device-train-batch-size 0
expect --per-device-train-batch-size --per-device-train-batch-size -3
expect --gradient-accumulation-steps --gradient-accumulation-steps 0
expect --seq-len --seq-len 65
expect --n-head --n-head 5
expect --model --model gpt-9000
expect --data --data "$work/no_such_file.bin"
expect --init --init "$work/no_such_file.safetensors"
expect --learning-rate --learning-rate fast
expect --max-steps --max-steps 1.5
expect --device --device tpu
expect --tf32 --tf32 maybe
expect --tf32 --device cpu --tf32 true
expect --offload --offload
expect --save-every --save-every 2
expect --resume --resume "$work/no_such_directory"
expect --no-such-flag --no-such-flag
expect --dropout --dropout 1.5
expect --data-layout --data-layout ragged
expect --eot-token --eot-token 256
expect --communicator --communicator gloo
expect --zero-stage --zero-stage 4
# ZeRO-3 with the model state on the host: the segments' gradients summed in the host shards need streaming, and it
# gathers the segments' weights itself (streamed parameters beside it are refused).
expect --zero-stage --zero-stage 3 --gradient-checkpointing --offload-optimizer cpu
expect --offload-parameters --zero-stage 3 --gradient-checkpointing --offload-optimizer cpu --offload-gradients stream \
  --offload-parameters cpu
expect --offload-optimizer --offload-optimizer cpu
expect --offload-optimizer --offload-optimizer gpu
expect --max-host-memory --max-host-memory lots
expect --offload-gradients --offload-gradients stream
expect --offload-gradients --offload-gradients sideways
expect --offload-parameters --offload-parameters cpu
expect --offload-parameters --offload-parameters sideways
expect --loss-normalization --loss-normalization median
expect --loss-chunk-tokens --loss-chunk-tokens 0
expect --loss-chunk-tokens --loss-chunk-tokens -16
expect --loss-chunk-tokens --loss-chunk-tokens many
expect --loss-chunk-tokens --loss-chunk-tokens 513 # the default micro-batch holds 8 x 64 = 512 tokens
expect --loss-chunk-tokens --per-device-train-batch-size 2 --seq-len 32 --loss-chunk-tokens 65
expect --mlp-tile-tokens --mlp-tile-tokens 0
expect --mlp-tile-tokens --mlp-tile-tokens -16
expect --mlp-tile-tokens --mlp-tile-tokens wide
expect --mlp-tile-tokens --mlp-tile-tokens 513 # the default micro-batch holds 8 x 64 = 512 tokens
expect --mlp-tile-tokens --per-device-train-batch-size 2 --seq-len 32 --mlp-tile-tokens 65
# --eval-data: the flags that need it, its file (missing, a directory, too short for one batch, ids outside the
# vocabulary), K and M below 1, and K beyond the batches the file holds (600 bytes: 9 windows, one batch of 8).
printf 'a%.0s' $(seq 600) >"$work/six_hundred.txt"
expect --eval-steps --eval-steps 3
expect --eval-every --eval-every 3
expect --eval-data --eval-data "$work/no_such_file.bin"
expect --eval-data --eval-data "$work"
expect --eval-data --eval-data "$work/not_a_shard.bin"
expect --eval-data --data "$work/six_hundred.txt" --vocab-size 128 --eval-data "$work/high_byte.txt"
expect --eval-steps --eval-data "$work/six_hundred.txt" --eval-steps 0
expect --eval-steps --eval-data "$work/six_hundred.txt" --eval-steps two
expect --eval-every --eval-data "$work/six_hundred.txt" --eval-every 0
expect --eval-steps --eval-data "$work/six_hundred.txt" --eval-steps 2
# LoRA: flags that need --lora-r, bad values, targets the model lacks, outputs that cannot be written.
expect --lora-r --lora-r 0
expect --lora-r --model llama-tiny --lora-r 4096
expect --lora-alpha --lora-alpha 16
expect --lora-dropout --lora-r 4 --lora-dropout 1.5
expect --lora-target-modules --model llama-tiny --lora-r 4 --lora-target-modules q_proj,c_attn
expect --lora-target-modules --lora-r 4 --lora-target-modules lm_head
expect --save --lora-r 4 --save "$work/lora.safetensors"
expect --max-memory --lora-r 4 --max-memory 1KiB
# Pinned memory is a device's: the CPU backend refuses a budget for it; a CUDA plan names the pinned budget it misses.
expect --world-size --world-size 2
expect --world-size --plan --world-size 0
expect --max-pinned-memory --device cpu --max-pinned-memory 1MiB
expect --max-pinned-memory --max-pinned-memory lots
expect "max-pinned-memory: no plan fits in 100 B of pinned host memory" --device cuda --plan --max-memory 64MiB --max-pinned-memory 100 --global-batch-size 16
expect --init-adapter --init-adapter "$work"
expect --save-adapter --save-adapter "$work/stdout"
expect --merge --merge "$work/stderr" --lora-r 4
expect --merge --merge "$work/lora_merged"
# QLoRA: a 4-bit base trains nothing without adapters.
expect --load-in-4bit --load-in-4bit
expect --load-in-4bit --model llama-tiny --load-in-4bit --save-adapter "$work/qlora_adapter"
# Sizes no machine could hold or the kernels could not index (nn/config_limits.h): refused at once, naming the flag;
# paths that exist but are not regular files named as what they are.
expect --n-layer --n-layer 100000000 --plan
expect --n-embd --n-embd 30000 --n-head 1 --plan
expect --vocab-size --vocab-size 2147483647 --plan
expect --intermediate-size --model llama-tiny --n-embd 4096 --intermediate-size 1000000 --plan
expect --n-layer --n-layer 1024 --n-embd 16384 --n-head 64 --plan
expect "--data: '/dev/null' is a character device" --data /dev/null
expect "--data: '$work' is a directory" --data "$work"
expect "--init: '/dev/null' is a character device" --init /dev/null
# Outputs proven writable before the first step (docs/RELIABILITY.md, "Outputs"): a folder no file can be
# created in, for each output flag; nothing trains, nothing is written.
expect --save --save /proc/x.safetensors
expect --save --save /proc/model_dir
expect --out --out /proc/state --save-every 1
expect --log --log /proc/log.jsonl
expect --save-adapter --lora-r 4 --save-adapter /proc/adapter
expect --merge --lora-r 4 --merge /proc/merged
expect "--out: '$work/stdout' is a regular file, not a directory" --out "$work/stdout/state"
# ... and a file system without room for what they will hold: a 64 KiB tmpfs in a mount namespace of our own
# (where user namespaces are switched off, the check is reported as not run rather than failed).
if unshare -rm true 2>/dev/null; then
total=$((total + 1))
unshare -rm bash -c 'mkdir -p "$1/tiny" && mount -t tmpfs -o size=64k tmpfs "$1/tiny" &&
  "$2" --out "$1/tiny/state" --save-every 1 --max-steps 3 --log "$1/tiny/log.jsonl" >"$1/stdout" 2>"$1/stderr";
  echo $? >"$1/rc"; ls -A "$1/tiny" >"$1/left"' _ "$work" "$train_gpt"
if [ "$(cat "$work/rc" 2>/dev/null)" = 2 ] && [ "$(wc -l <"$work/stderr")" -eq 1 ] &&
   grep -q -- "--out: .* has 64.00 KiB free, but 3 training states (--out) need at least" "$work/stderr" &&
   [ ! -s "$work/stdout" ] && [ ! -s "$work/left" ]; then
  echo "ok: no room for --out -> $(cat "$work/stderr")"
else
  echo "FAIL: no room for --out -> exit $(cat "$work/rc" 2>/dev/null), left $(cat "$work/left" 2>/dev/null): $(cat "$work/stderr" 2>/dev/null)"
  failures=$((failures + 1))
fi
else
  echo "NOT RUN: no room for --out (unshare -rm is not permitted here: no user namespaces)"
fi
# A data file whose token ids exceed the vocabulary is refused naming the file and the offset.
"$train_gpt" --data "$work/high_byte.txt" --vocab-size 128 >"$work/stdout" 2>"$work/stderr"
rc=$?
total=$((total + 1))
if [ "$rc" -eq 0 ] || ! grep -q "high_byte.txt" "$work/stderr" || ! grep -q "offset" "$work/stderr"; then
  echo "FAIL: out-of-vocabulary data -> exit $rc: $(head -c 300 "$work/stderr")"
  failures=$((failures + 1))
else
  echo "ok: out-of-vocabulary data -> exit $rc: $(cat "$work/stderr")"
fi
echo "$((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
