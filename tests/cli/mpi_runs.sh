# Sourced by the MPI ctests (train_gpt_mpi.sh, train_gpt_zero2.sh, train_gpt_zero3.sh), after they set $work and
# $mpiexec: the check counter, Open MPI's settings for this machine, `ranks N COMMAND...`, `write_documents FILE
# SEED`, and the resume checks `check_resume` and `check_other_stage`.
failures=0
total=0
python=$(command -v python3 || echo /usr/bin/python3) # json, struct, array and sys only
check() { # NAME CONDITION_EXIT_CODE DETAIL
  total=$((total + 1))
  if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1: $3"; failures=$((failures + 1)); fi
}
# Two ranks on a shared 2-core machine: one BLAS thread each. CI runs as root, which Open MPI refuses unless
# told; shared-memory transport without the single-copy mechanism that containers often forbid.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
ranks() { local count=$1; shift; "$mpiexec" --oversubscribe -np "$count" "$@"; }
mpirun2() { ranks 2 "$@"; }

# 600 documents of 3..80 bytes ending in '\n': padded to --seq-len 48 (the longer ones truncated), so every
# sequence, micro-batch and rank has its own number of targets.
write_documents() { # FILE SEED
  "$python" - "$1" "$2" <<'PY'
import random, sys
random.seed(int(sys.argv[2]))
letters = "abcdefghij klmnop"
with open(sys.argv[1], "w") as out:
    for _ in range(600):
        out.write("".join(random.choice(letters) for _ in range(random.randint(2, 79))) + "\n")
PY
}

# check_resume RANKS NAME HALF STEPS ARGS...: train_gpt ARGS on RANKS ranks saved at step HALF (--out $work/NAME_state)
# and resumed to step STEPS saves bitwise the weights of a run of STEPS straight (four checks; $train_gpt and $work set).
check_resume() {
  local count=$1 name=$2 half=$3 steps=$4
  shift 4
  ranks "$count" "$train_gpt" "$@" --max-steps "$steps" --save "$work/${name}_straight.safetensors" \
    >"$work/${name}_straight.out" 2>&1
  check "$name: $steps steps straight" $? "$(tail -5 "$work/${name}_straight.out")"
  ranks "$count" "$train_gpt" "$@" --max-steps "$half" --out "$work/${name}_state" >"$work/${name}_first.out" 2>&1
  check "$name: $half steps saving a training state" $? "$(tail -5 "$work/${name}_first.out")"
  ranks "$count" "$train_gpt" "$@" --max-steps "$steps" --resume "$work/${name}_state" \
    --save "$work/${name}_resumed.safetensors" >"$work/${name}_resumed.out" 2>&1
  check "$name: resumes from step $half" $? "$(tail -5 "$work/${name}_resumed.out")"
  cmp -s "$work/${name}_straight.safetensors" "$work/${name}_resumed.safetensors"
  check "$name: the resumed run's weights equal the straight run's bitwise" $? "they differ"
}

# check_other_stage RANKS STATE SAVED OTHER ARGS...: a state saved at --zero-stage SAVED, resumed at OTHER, is refused
# with exit 2 naming both stages.
check_other_stage() {
  local count=$1 state=$2 saved=$3 other=$4
  shift 4
  ranks "$count" "$train_gpt" "$@" --zero-stage "$other" --resume "$state" >"$work/other_stage.out" 2>&1
  local code=$?
  [ $code -eq 2 ] && grep -q "saved at --zero-stage $saved; this run has $other" "$work/other_stage.out"
  check "a stage-$saved state resumed at stage $other: exit 2 naming both stages" $? \
    "exit $code: $(tail -3 "$work/other_stage.out")"
}
