#!/usr/bin/env bash
# Side-by-side CPU benchmark (issue 16): train_gpt and the same GPT-2 step in PyTorch, on this machine, in one run.
# Reports step times, tokens/s, the ratio libengine/PyTorch and train_gpt's --profile table; it is not a test.
#
# usage: bench/compare_pytorch.sh            (from anywhere; run from a build with build/bench/train_gpt)
# environment:
#   TRAIN_GPT=path     the binary to time (default: <repo>/build/bench/train_gpt)
#   MODELS="..."       train_gpt model names (default "gpt2-124M small")
#   WARMUP=2 STEPS=3   steps left out (they warm caches and buffers), then steps timed, on both sides
#   BATCH=4 SEQ=128    sequences per step and tokens per sequence
#   PYTHON=python      an interpreter with torch (default /usr/bin/python3: Debian's python3-torch is there)
#   WORK=dir           where the token shards, logs and outputs go (default a new temporary directory)
# Both sides: fp32, AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights), gradient norm clipped
# to 1.0, a constant learning rate, one micro-batch per step, every core (train_gpt: OpenBLAS's threads as the
# environment sets them; PyTorch: torch.set_num_threads(nproc)). OPENBLAS_* variables are printed and passed
# through unchanged: on some processors the environment sets OPENBLAS_CORETYPE on purpose.
# Exit status: 0 when both sides ran for every model (whatever the ratio), 1 when something failed to run.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
train_gpt=${TRAIN_GPT:-$repo/build/bench/train_gpt}
models=${MODELS:-"gpt2-124M small"}
warmup=${WARMUP:-2}
steps=${STEPS:-3}
batch=${BATCH:-4}
seq=${SEQ:-128}
python=${PYTHON:-/usr/bin/python3}
work=${WORK:-$(mktemp -d /tmp/compare_pytorch.XXXXXX)}
mkdir -p "$work"
failed=0

fail() { echo "compare_pytorch: $*" >&2; failed=1; }

[ -x "$train_gpt" ] || { echo "compare_pytorch: no train_gpt at $train_gpt (build it, or set TRAIN_GPT)" >&2; exit 1; }
[ -x "$python" ] || python=$(command -v python3)

# PyTorch is only this benchmark's dependency, so scripts/install_deps.sh leaves it out; install it here.
if ! "$python" -c "import torch" 2>/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's python3-torch (missing)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >"$work/apt.log" 2>&1 ||
      { apt-get update >>"$work/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >>"$work/apt.log" 2>&1; }
    python=/usr/bin/python3
  fi
  "$python" -c "import torch" 2>/dev/null ||
    { echo "compare_pytorch: torch is not importable by $python and could not be installed (see $work/apt.log)" >&2; exit 1; }
fi

echo "== machine"
date -u
echo "commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores available"
echo "uptime:$(uptime)"
echo "train_gpt: $train_gpt"
for variable in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS OMP_NUM_THREADS OMP_WAIT_POLICY; do
  echo "$variable=${!variable-<unset>} (passed through unchanged)"
done
blas=$(ldd "$train_gpt" | awk '/blas/ {print $3; exit}')
[ -n "$blas" ] && blas=$(readlink -f "$blas")
# The core OpenBLAS picks in this environment: the same library, variables and CPU train_gpt runs with.
"$python" - "$blas" <<'PY'
import ctypes, sys
path = sys.argv[1]
if not path:
    print("train_gpt's BLAS: not found by ldd")
    sys.exit(0)
try:
    library = ctypes.CDLL(path)
    library.openblas_get_corename.restype = ctypes.c_char_p
    print(f"train_gpt's BLAS: {path}: OpenBLAS core {library.openblas_get_corename().decode()}, "
          f"{library.openblas_get_num_threads()} threads")
except (OSError, AttributeError) as error:
    print(f"train_gpt's BLAS: {path} (not OpenBLAS, or no core query: {error})")
PY
"$python" -c "import os, torch; torch.set_num_threads(os.cpu_count()); print(f'torch {torch.__version__}: {torch.get_num_threads()} threads (set to nproc by the benchmark; default {torch.get_num_interop_threads()} inter-op)')"

# An llm.c token shard (uint16 ids below the vocabulary, 1024-byte header) of random tokens.
write_shard() { # PATH VOCABULARY TOKENS
  "$python" - "$1" "$2" "$3" <<'PY'
import random, struct, sys
path, vocabulary, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(1234)
header = struct.pack("<3i", 20240520, 1, count).ljust(1024, b"\0")
tokens = struct.pack(f"<{count}H", *(random.randrange(vocabulary) for _ in range(count)))
open(path, "wb").write(header + tokens)
PY
}

# The architecture of a train_gpt model name, as "vocab max_seq_len n_layer n_head n_embd": from the model line
# of train_gpt --plan (which builds nothing), so that the PyTorch side cannot drift from it.
model_sizes() { # NAME
  "$train_gpt" --model "$1" --plan --device cpu 2>/dev/null |
    sed -n 's/^model: vocab \([0-9]*\), max_seq_len \([0-9]*\), layers \([0-9]*\), heads \([0-9]*\), width \([0-9]*\).*/\1 \2 \3 \4 \5/p' | head -1
}

summary=()
for model in $models; do
  echo
  echo "== $model: B=$batch, T=$seq, fp32, AdamW, $warmup warm-up + $steps timed steps"
  read -r vocabulary max_seq_len layers heads width <<<"$(model_sizes "$model")"
  if [ -z "${width:-}" ]; then fail "$model: train_gpt did not print its sizes"; continue; fi
  echo "architecture: vocab $vocabulary, max_seq_len $max_seq_len, $layers layers, $heads heads, width $width"
  shard="$work/$model.bin"
  write_shard "$shard" "$vocabulary" $(((warmup + steps + 2) * batch * (seq + 1) + 4096))

  # train_gpt: its own per-step `seconds` from --log, the same warm-up rule as --profile's (the first 2 steps).
  log="$work/$model.jsonl"
  echo "-- train_gpt"
  "$train_gpt" --model "$model" --device cpu --data "$shard" --seq-len "$seq" --per-device-train-batch-size "$batch" \
    --gradient-accumulation-steps 1 --max-grad-norm 1.0 --lr-scheduler-type constant --warmup-steps 0 \
    --learning-rate 3e-4 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --max-steps $((warmup + steps)) \
    --logging-steps 1 --log "$log" --profile >"$work/$model.train_gpt.out" 2>&1
  status=$?
  grep -E "^(model:|step +[0-9]|first loss)" "$work/$model.train_gpt.out"
  if [ $status -ne 0 ]; then fail "$model: train_gpt exited $status: $(tail -2 "$work/$model.train_gpt.out")"; continue; fi
  engine_seconds=$("$python" - "$log" "$warmup" <<'PY'
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
timed = [line["seconds"] for line in lines if line["step"] > int(sys.argv[2])]
print(sum(timed) / len(timed))
PY
  ) || { fail "$model: cannot read $log"; continue; }

  echo "-- PyTorch"
  "$python" "$repo/bench/pytorch_gpt_step.py" --vocab-size "$vocabulary" --max-seq-len "$max_seq_len" \
    --n-layer "$layers" --n-head "$heads" --n-embd "$width" --batch "$batch" --seq-len "$seq" \
    --warmup "$warmup" --steps "$steps" --threads "$(nproc)" >"$work/$model.pytorch.out" 2>&1
  status=$?
  grep -v '^RESULT ' "$work/$model.pytorch.out"
  if [ $status -ne 0 ]; then fail "$model: pytorch_gpt_step.py exited $status"; continue; fi
  torch_seconds=$(sed -n 's/^RESULT //p' "$work/$model.pytorch.out" | "$python" -c "import json,sys; print(json.load(sys.stdin)['mean_step_seconds'])")

  line=$("$python" - "$model" "$engine_seconds" "$torch_seconds" "$((batch * seq))" <<'PY'
import sys
model, engine, torch, tokens = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
print(f"{model:<10} libengine {engine:8.3f} s/step {tokens / engine:9.1f} tok/s | PyTorch {torch:8.3f} s/step "
      f"{tokens / torch:9.1f} tok/s | libengine/PyTorch (tokens/s) {torch / engine:.2f}x")
PY
  )
  echo "$line"
  summary+=("$line")
  echo "-- train_gpt --profile ($model)"
  sed -n '/^op profile/,$p' "$work/$model.train_gpt.out"
done

echo
echo "== summary (mean over the $steps timed steps; uptime:$(uptime))"
for line in "${summary[@]}"; do echo "$line"; done
echo "outputs in $work"
exit $failed
