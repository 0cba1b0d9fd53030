# Sourced by the MPI ctests (train_gpt_mpi.sh, train_gpt_zero2.sh), after they set $work and $mpiexec: the check
# counter, Open MPI's settings for this machine, `ranks N COMMAND...`, and `write_documents FILE SEED`.
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
