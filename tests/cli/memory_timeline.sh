#!/usr/bin/env bash
# ctest memory_timeline: train_gpt --memory-timeline FILE records one step, whose events read back give the step's
# measured peak, equal to the plan's prediction; the file is Chrome's trace format; scripts/plot_memory.py draws it;
# bad flags and a bad file are refused with one line. usage: memory_timeline.sh TRAIN_GPT SOURCE_DIR WORK_DIR
set -u
train_gpt=$1
source_dir=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
failures=0
total=0
python=/usr/bin/python3
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}

# Llama with checkpointing and two micro-batches, and GPT-2 (the main job's model) with bf16: step 2 each.
"$train_gpt" --model llama-tiny --max-steps 2 --gradient-checkpointing --gradient-accumulation-steps 2 \
  --per-device-train-batch-size 4 --memory-timeline "$work/llama.json" --memory-timeline-step 2 >"$work/llama.out" 2>&1
check "train_gpt --memory-timeline (Llama, checkpointed)" $? "$(tail -3 "$work/llama.out")"
"$train_gpt" --max-steps 2 --precision bf16 --memory-timeline "$work/gpt.json" >"$work/gpt.out" 2>&1
check "train_gpt --memory-timeline (GPT-2, bf16, the run's first step)" $? "$(tail -3 "$work/gpt.out")"
for name in llama gpt; do
  "$python" - "$work/$name.json" <<'PY'
import json, sys
document = json.load(open(sys.argv[1]))
recording = document["libengine"]
metadata = recording["metadata"]
# The events read back: the account's bytes from the start, event by event; their high-water mark is the step's
# measured joint peak (the trainer resets the peak at the step's start), and the plan predicted it.
current = sum(recording["start"]["cpu"].values())
start, peak = current, current
for event in recording["events"]:
    assert event["device"] == "cpu", event
    assert event["category"] in ("parameters", "gradients", "optimizer_state", "activations", "workspace", "pinned_host")
    assert event["phase"] in ("forward", "backward", "grad_norm", "optimizer")
    current += event["bytes"]
    peak = max(peak, current)
assert peak == metadata["peak_bytes"], (peak, metadata)
assert metadata["predicted_peak_bytes"] == peak, metadata
assert current == start, "the step did not give back what it took"
phases = {event["phase"] for event in recording["events"]}
assert {"forward", "backward"} <= phases, phases
ops = {event["op"] for event in recording["events"]}
assert "attention" in ops and ("matmul" in ops or "linear" in ops), ops
# Chrome's trace format: counters ("C") named by account, one series per category.
counters = [event for event in document["traceEvents"] if event["ph"] == "C"]
assert len(counters) == len(recording["events"]) + 1
assert set(counters[-1]["args"]) >= {"activations", "workspace", "parameters"}
print(f"{sys.argv[1]}: {len(recording['events'])} events, peak {peak} B = predicted, step {metadata['step']}")
PY
  check "$name: the events give the measured peak, equal to the prediction" $? "see above"
  "$python" "$source_dir/scripts/plot_memory.py" "$work/$name.json" --output "$work/$name.png" >"$work/$name.plot" 2>&1 &&
    head -c 8 "$work/$name.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a"
  check "$name: plot_memory.py draws a PNG" $? "$(cat "$work/$name.plot")"
done
grep -q "memory timeline of step 2: .* allocations and frees in $work/llama.json" "$work/llama.out"
check "train_gpt names the recorded step and its file" $? "$(grep timeline "$work/llama.out")"

# Refusals: one line, exit 2, before training.
"$train_gpt" --max-steps 2 --memory-timeline-step 1 >"$work/bad1.out" 2>&1
test $? -eq 2 && grep -q "error: --memory-timeline-step: needs --memory-timeline FILE" "$work/bad1.out"
check "--memory-timeline-step without a file" $? "$(cat "$work/bad1.out")"
"$train_gpt" --max-steps 2 --memory-timeline "$work/x.json" --memory-timeline-step 3 >"$work/bad2.out" 2>&1
test $? -eq 2 && grep -q "error: --memory-timeline-step: 3 is past --max-steps 2" "$work/bad2.out"
check "--memory-timeline-step past the run" $? "$(cat "$work/bad2.out")"
"$train_gpt" --max-steps 2 --memory-timeline /proc/x.json >"$work/bad3.out" 2>&1
test $? -eq 2 && grep -q "error: --memory-timeline" "$work/bad3.out" && ! grep -q "^step" "$work/bad3.out"
check "--memory-timeline where nothing can be written, refused before training" $? "$(cat "$work/bad3.out")"
echo "not json" >"$work/bad.json"
"$python" "$source_dir/scripts/plot_memory.py" "$work/bad.json" >"$work/bad_plot.out" 2>&1
test $? -eq 2 && grep -q "plot_memory: error: .*bad.json is not JSON" "$work/bad_plot.out"
check "plot_memory.py refuses a file that is not JSON" $? "$(cat "$work/bad_plot.out")"
echo '{"traceEvents": []}' >"$work/other.json"
"$python" "$source_dir/scripts/plot_memory.py" "$work/other.json" >"$work/other_plot.out" 2>&1
test $? -eq 2 && grep -q "is not a libengine memory timeline" "$work/other_plot.out"
check "plot_memory.py refuses a trace libengine did not write" $? "$(cat "$work/other_plot.out")"

echo "$((total - failures))/$total checks passed"
[ "$failures" -eq 0 ]
