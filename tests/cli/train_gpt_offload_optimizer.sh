#!/usr/bin/env bash
# ctest train_gpt_emulated_offload_optimizer (emulated build only): train_gpt --device cuda
# --offload-optimizer cpu, with the gradients summed on the device (window) or on the host (stream), logs bitwise
# the losses and grad norms of the same run with the optimizer on the device (GPT-2 and Llama, bf16,
# accumulation and checkpointing), moves the optimizer state off the device (its peak optimizer_state is 0),
# streamed gradients take less device memory than the window's, streamed parameters (--offload-parameters cpu)
# less again in parameters, and it refuses with one line and exit 2, before any step: a host budget that cannot
# hold the state, a resume of a state saved with the other tier, and streamed parameters without the optimizer
# on the host or without checkpointing.
# With MPIEXEC: 2 ranks with the optimizer on the host, ZeRO-1 and streamed gradients (the gradients reduced
# on the host, over MPI): replicas bitwise equal after every step, each rank's host holding half the optimizer
# state, and the losses of the same 2-rank run without ZeRO-1 within 1e-6; ZeRO-3 bitwise ZeRO-2 (weights, losses,
# norms), its host keeping its part of the segments' masters, its host peak --plan's to the byte, resumed bitwise.
# usage: train_gpt_offload_optimizer.sh TRAIN_GPT WORK_DIR [MPIEXEC]
set -u
train_gpt=$1
work=$2
mpiexec=${3:-}
rm -rf "$work" && mkdir -p "$work"
python=$(command -v python3 || command -v /usr/bin/python3 || echo python3) # only json and sys are used
flags=(--device cuda --precision bf16 --max-steps 3 --per-device-train-batch-size 2 --seq-len 32
       --gradient-accumulation-steps 2 --gradient-checkpointing --max-grad-norm 0.5)
for model in tiny llama-tiny; do
  for tier in none cpu stream parameters; do
    tier_flags=(--offload-optimizer "$tier")
    [ "$tier" = stream ] && tier_flags=(--offload-optimizer cpu --offload-gradients stream)
    [ "$tier" = parameters ] && tier_flags=(--offload-optimizer cpu --offload-gradients stream --offload-parameters cpu)
    if ! "$train_gpt" --model "$model" "${flags[@]}" "${tier_flags[@]}" --log "$work/$model-$tier.jsonl" \
        --out "$work/state-$model-$tier" >"$work/$model-$tier.out" 2>&1; then
      echo "FAIL: train_gpt --model $model --offload-optimizer $tier exited non-zero:"
      tail -5 "$work/$model-$tier.out"
      exit 1
    fi
  done
  "$python" - "$work/$model-none.jsonl" "$work/$model-cpu.jsonl" "$work/$model-stream.jsonl" \
      "$work/$model-parameters.jsonl" <<'PY' || exit 1
import json, sys
device, host, stream, parameters = ([json.loads(line) for line in open(path)] for path in sys.argv[1:5])
assert len(device) == len(host) == len(stream) == len(parameters) and device, "step counts differ"
for a, b, c, d in zip(device, host, stream, parameters):
    for other in (b, c, d):
        assert a["loss"] == other["loss"] and a["grad_norm"] == other["grad_norm"], f"step {a['step']}: {a} vs {other}"
        assert other["peak_mib"]["optimizer_state"] == 0 < a["peak_mib"]["optimizer_state"], "state on the device"
    assert c["peak_mib"]["gradients"] < b["peak_mib"]["gradients"], "streamed gradients took no less device memory"
    # The tiny GPT-2 has two layers, both on the device at once (one running, the next prefetched): no saving.
    fewer = (lambda x, y: x < y) if "llama" in sys.argv[1] else (lambda x, y: x <= y)
    assert fewer(d["peak_mib"]["parameters"], c["peak_mib"]["parameters"]), "streamed parameters took more device memory"
    assert d["host_peak_mib"]["pinned_host"] > c["host_peak_mib"]["pinned_host"], "no working copy parked on the host"
    assert fewer(d["peak_total_bytes"], c["peak_total_bytes"]), "streamed parameters raised the device peak"
    assert c["peak_total_bytes"] < b["peak_total_bytes"] < a["peak_total_bytes"], "the device peak did not fall"
print(f"{sys.argv[2]}: {len(host)} steps bitwise the on-device run's, streamed gradients and parameters too; "
      f"device peak {device[-1]['peak_total_bytes']} -> {host[-1]['peak_total_bytes']} -> "
      f"{stream[-1]['peak_total_bytes']} -> {parameters[-1]['peak_total_bytes']} B")
PY
done

failures=0
# expect FLAG ARGS...: train_gpt ARGS must fail with exit 2, one stderr line naming FLAG, and no step line.
expect() {
  local flag=$1
  shift
  "$train_gpt" "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  if [ "$rc" -ne 2 ] || [ "$(wc -l <"$work/stderr")" -ne 1 ] || ! grep -q -- "$flag" "$work/stderr" ||
      grep -q "^step" "$work/stdout"; then
    echo "FAIL: train_gpt $* -> exit $rc: $(head -c 300 "$work/stderr")"
    failures=$((failures + 1))
  else
    echo "ok: $(cat "$work/stderr")"
  fi
}
expect --max-host-memory "${flags[@]}" --offload-optimizer cpu --max-host-memory 64KiB
expect --resume "${flags[@]}" --offload-optimizer cpu --max-steps 4 --resume "$work/state-tiny-none"
expect --resume "${flags[@]}" --offload-optimizer none --max-steps 4 --resume "$work/state-tiny-cpu"
expect --offload-parameters "${flags[@]}" --offload-parameters cpu
expect --offload-parameters --device cuda --max-steps 1 --offload-optimizer cpu --offload-parameters cpu
expect --offload-parameters "${flags[@]}" --offload-optimizer cpu --offload-parameters gpu
[ "$failures" -eq 0 ] || exit 1
# The same tier resumes.
"$train_gpt" "${flags[@]}" --offload-optimizer cpu --max-steps 4 --resume "$work/state-tiny-cpu" >"$work/resumed.out" 2>&1 ||
  { echo "FAIL: resume with the same tier:"; tail -5 "$work/resumed.out"; exit 1; }
echo "ok: the same tier resumes"
# Streamed parameters change where the working copies live, not the saved state: their state resumes without.
"$train_gpt" "${flags[@]}" --offload-optimizer cpu --max-steps 4 --resume "$work/state-tiny-parameters" \
    >"$work/resumed-parameters.out" 2>&1 ||
  { echo "FAIL: resume of a state saved with streamed parameters:"; tail -5 "$work/resumed-parameters.out"; exit 1; }
echo "ok: a state saved with streamed parameters resumes without them"

[ -n "$mpiexec" ] || exit 0
# As tests/cli/train_gpt_mpi.sh: CI runs as root, and the ranks share two cores.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ZeRO-1's and ZeRO-2's runs stream the parameters too: the same losses, since the weights the forward reads are the
# same (ZeRO-2 sums each micro-batch over the ranks first: the same within rounding).
# ZeRO-3 gathers the segments' weights itself (streamed parameters are refused beside it). Four layers, so that a
# rank's part of the segments' masters and one gathered segment are less than all of them.
for zero in 0 1 2 3; do
  streamed_parameters=()
  [ "$zero" = 1 ] || [ "$zero" = 2 ] && streamed_parameters=(--offload-parameters cpu)
  "$mpiexec" --oversubscribe -np 2 "$train_gpt" "${flags[@]}" --n-layer 4 --offload-optimizer cpu --offload-gradients stream \
      "${streamed_parameters[@]}" --zero-stage "$zero" --check-replicas --log "$work/ranks-zero$zero.jsonl" \
      --save "$work/ranks-zero$zero.safetensors" >"$work/ranks-zero$zero.out" 2>&1 ||
    { echo "FAIL: 2 ranks, ZeRO stage $zero:"; tail -5 "$work/ranks-zero$zero.out"; exit 1; }
done
# ZeRO-3 with the model state on the host sums as stage 2 does and gathers each segment's masters on the host from
# their owners, bit for bit: the same weights and losses, and on the device a segment's working copies at a time.
cmp -s "$work/ranks-zero2.safetensors" "$work/ranks-zero3.safetensors" ||
  { echo "FAIL: 2 ranks with the model state on the host: ZeRO-3's weights differ from ZeRO-2's"; exit 1; }
"$python" - "$work/ranks-zero2.jsonl" "$work/ranks-zero3.jsonl" <<'PY' || exit 1
import json, sys
zero2, zero3 = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
assert len(zero2) == len(zero3) and zero3
for two, three in zip(zero2, zero3):
    step = two["step"]
    assert two["loss"] == three["loss"] and two["grad_norm"] == three["grad_norm"], f"step {step}: {two} vs {three}"
    assert three["replicas_identical"], f"step {step}: ZeRO-3's replicas of what it keeps whole differ"
    assert three["communication"]["broadcasts"] > 0, f"step {step}: ZeRO-3 gathered nothing"
    assert three["peak_mib"]["optimizer_state"] == 0 and three["host_peak_mib"]["optimizer_state"] == two["host_peak_mib"]["optimizer_state"]
    # The host keeps this rank's part of the segments' masters instead of all of them.
    assert three["host_peak_mib"]["parameters"] < two["host_peak_mib"]["parameters"], f"step {step}: host parameters"
zero0 = [json.loads(line) for line in open(sys.argv[1].replace("zero2", "zero0"))]
for whole, three in zip(zero0, zero3): # the device holds a segment's copies at a time instead of every layer's
    assert three["peak_mib"]["parameters"] < whole["peak_mib"]["parameters"], f"step {three['step']}: device parameters"
print(f"2 ranks, ZeRO-3 with the model state on the host: bitwise ZeRO-2's weights, losses and norms; host parameters "
      f"{zero2[-1]['host_peak_mib']['parameters']:.3f} -> {zero3[-1]['host_peak_mib']['parameters']:.3f} MiB, device "
      f"parameters {zero0[-1]['peak_mib']['parameters']:.3f} (stage 0) / {zero2[-1]['peak_mib']['parameters']:.3f} "
      f"(ZeRO-2, streamed) -> {zero3[-1]['peak_mib']['parameters']:.3f} MiB")
PY
# Its host peak on rank 0 is --plan's to the byte, with the inputs on the device and offloaded (the gather's transient
# beside the other segments' pinned inputs); and a state it saves resumes bitwise.
stage3=("${flags[@]}" --n-layer 4 --offload-optimizer cpu --offload-gradients stream --zero-stage 3)
"$mpiexec" --oversubscribe -np 2 "$train_gpt" "${stage3[@]}" --offload --log "$work/ranks-zero3-offload.jsonl" \
    >"$work/ranks-zero3-offload.out" 2>&1 || { echo "FAIL: 2 ranks, ZeRO-3, --offload:"; tail -5 "$work/ranks-zero3-offload.out"; exit 1; }
for run in "ranks-zero3" "ranks-zero3-offload --offload"; do
  set -- $run
  log=$1
  shift
  predicted=$("$train_gpt" "${stage3[@]}" "$@" --plan --world-size 2 2>&1 | sed -n 's/.*; host peak [^(]*(\([0-9]*\) B).*/\1/p')
  measured=$(sed -n 's/.*"host_peak_total_bytes":\([0-9]*\).*/\1/p' "$work/$log.jsonl" | sort -n | tail -1)
  [ -n "$predicted" ] && [ "$predicted" = "$measured" ] ||
    { echo "FAIL: 2 ranks, ZeRO-3 with the state on the host ($*): host peak predicted $predicted B, measured $measured B"; exit 1; }
  echo "ok: 2 ranks, ZeRO-3 with the state on the host $*: the host peak $measured B is --plan's"
done
"$mpiexec" --oversubscribe -np 2 "$train_gpt" "${stage3[@]}" --max-steps 2 --out "$work/state-zero3" >"$work/zero3-half.out" 2>&1 &&
  "$mpiexec" --oversubscribe -np 2 "$train_gpt" "${stage3[@]}" --resume "$work/state-zero3" \
    --save "$work/resumed-zero3.safetensors" >"$work/zero3-resumed.out" 2>&1 ||
  { echo "FAIL: 2 ranks, ZeRO-3 with the state on the host: save and resume"; tail -5 "$work/zero3-half.out" "$work/zero3-resumed.out"; exit 1; }
cmp -s "$work/ranks-zero3.safetensors" "$work/resumed-zero3.safetensors" ||
  { echo "FAIL: 2 ranks, ZeRO-3 with the state on the host: the resumed run's weights differ from the straight run's"; exit 1; }
echo "ok: 2 ranks, ZeRO-3 with the state on the host: saved at step 2 and resumed, bitwise the straight run"
"$python" - "$work/ranks-zero0.jsonl" "$work/ranks-zero1.jsonl" "$work/ranks-zero2.jsonl" <<'PY' || exit 1
import json, sys
whole, zero, zero2 = ([json.loads(line) for line in open(path)] for path in sys.argv[1:4])
assert len(whole) == len(zero) == len(zero2) and whole
for a, b, c in zip(whole, zero, zero2):
    for run, name in ((b, "ZeRO-1"), (c, "ZeRO-2")):
        assert run["replicas_identical"] and a["replicas_identical"], f"step {a['step']}: {name} replicas differ"
        assert abs(a["loss"] - run["loss"]) <= 1e-6 * abs(a["loss"]), f"step {a['step']}: {a['loss']} vs {name} {run['loss']}"
        ratio = run["host_peak_mib"]["optimizer_state"] / a["host_peak_mib"]["optimizer_state"]
        assert 0.49 < ratio < 0.51, f"step {a['step']}: {name} keeps {ratio:.3f} of the host optimizer state"
    # ZeRO-2 keeps the streamed layers' gradients as its part only, on the host.
    assert c["host_peak_mib"]["gradients"] < b["host_peak_mib"]["gradients"], f"step {a['step']}: ZeRO-2's host gradients"
    assert c["communication"]["reduces"] > 0 and c["communication"]["reduce_scatters"] == 0
print(f"2 ranks, optimizer and gradients on the host: ZeRO-1 and 2 replicas identical, losses within 1e-6, host "
      f"optimizer state {whole[-1]['host_peak_mib']['optimizer_state']:.3f} -> {zero[-1]['host_peak_mib']['optimizer_state']:.3f} MiB, "
      f"host gradients {zero[-1]['host_peak_mib']['gradients']:.3f} (ZeRO-1) -> {zero2[-1]['host_peak_mib']['gradients']:.3f} MiB (ZeRO-2)")
PY
