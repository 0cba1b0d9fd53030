#!/usr/bin/env bash
# Side-by-side benchmark of optimizer offload's host step (issue 26): bench_host_step (the trainer's AdamW and
# bf16 write over 105M parameters, and a triad for the memory's bandwidth in the same process) against PyTorch's
# CPU AdamW, foreach and per tensor, with the same bf16 copy, at 1 and 2 threads. Prints each side's seconds,
# the ratio against PyTorch's faster variant, and the step's bandwidth as a fraction of the triad's. Not a test.
# usage: bench/compare_host_step.sh   (BENCH=path to bench_host_step, PYTHON=interpreter with torch)
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
bench=${BENCH:-$repo/build/bench/bench_host_step}
python=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/compare_host_step.XXXXXX)
[ -x "$bench" ] || { echo "compare_host_step: no bench_host_step at $bench (build it, or set BENCH)" >&2; exit 1; }
OMP_WAIT_POLICY=passive "$bench" --benchmark_format=json >"$work/engine.json" 2>"$work/engine.err" ||
  { echo "compare_host_step: bench_host_step failed:" >&2; tail -5 "$work/engine.err" >&2; exit 1; }
for threads in 1 2; do
  "$python" "$repo/bench/pytorch_adamw_step.py" "$threads" >>"$work/torch.jsonl" 2>"$work/torch.err" ||
    { echo "compare_host_step: the PyTorch side failed:" >&2; tail -5 "$work/torch.err" >&2; exit 1; }
done
"$python" - "$work/engine.json" "$work/torch.jsonl" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
torch_runs = [json.loads(line) for line in open(sys.argv[2])]
def seconds(name):
    times = [run["real_time"] / 1e3 for run in runs if run["name"].startswith(name) and run.get("run_type") == "iteration"]
    return min(times)
for threads in (1, 2):
    step = seconds(f"BM_host_step/{threads}/")
    triad = seconds(f"BM_triad/{threads}/")
    parameters = 100 * (1 << 20)
    step_rate = 30.0 * parameters / step
    triad_rate = 3 * 4.0 * parameters / triad
    ours = {r["variant"]: r["seconds"] for r in torch_runs if r["threads"] == threads}
    best = min(ours.values())
    print(f"threads {threads}: libengine {step:.3f} s ({step_rate / 1e9:.2f} GB/s, {step_rate / triad_rate:.0%} of the "
          f"triad's {triad_rate / 1e9:.2f} GB/s); PyTorch foreach {ours['foreach']:.3f} s, per tensor "
          f"{ours['per_tensor']:.3f} s; speed-up against PyTorch's faster: {best / step:.2f}x")
PY
echo "raw results: $work"
