#!/bin/bash
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --signal=B:USR1@300
# A training job gated on preflight: one preflight rank per node checks
# its node, then meets the others (rendezvous, comparisons, reachability,
# a short collective run); the training step starts only when every node
# is ready. One rank that is not ready makes every rank exit 1 with the
# culprit named (in the job's output), and --kill-on-bad-exit ends the
# step at once instead of letting the others wait.
set -euo pipefail
PREFLIGHT=${PREFLIGHT:-/usr/local/bin/preflight}

# One secret for this job, handed to every task through srun's
# environment: no process outside the job can pass for one of its ranks.
PREFLIGHT_TOKEN=$("$PREFLIGHT" token)
export PREFLIGHT_TOKEN

# One task per node here; with --ntasks-per-node=8 (one per GPU) each
# node's tasks check in through one leader, as the training's ranks will.
if ! srun --ntasks-per-node=1 --kill-on-bad-exit=1 \
        "$PREFLIGHT" run --timeout 120s ${PREFLIGHT_ARGS:-}; then
    echo "preflight: the allocation is not ready; the training step does not start" >&2
    exit 1
fi

# The watchdog: 5 minutes before the time limit (--signal above), a job
# still running may be hung. Every node is diagnosed in a step of this
# job (srun --overlap, no ssh), read-only, and the verdict saved where
# the epilog looks: if the job then runs out of time, the epilog drains
# the node of the rank that held it up (docs/diagnose.md).
workdir=$PWD
watchdog() {
    "$PREFLIGHT" diagnose --slurm --format json \
        --output "$workdir/preflight-diagnose-$SLURM_JOB_ID.json" || true
}
trap watchdog USR1

# The training step, started only on a ready allocation; in the
# background, so that the trap runs while it does.
srun ${TRAIN:-python3 train.py} &
train=$!
# A trap ends `wait` early (status over 128): wait again until the step
# ends, and exit with its status.
while wait "$train"; status=$?; kill -0 "$train" 2>/dev/null; do :; done
exit "$status"
