#!/usr/bin/env bash
# Training on a Slurm cluster:  bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [args]
#
# GPUS (tasks in all, default 8), GPUS_PER_NODE, CPUS_PER_TASK, SRUN_ARGS, PORT and PYTHON as
# in tools/slurm_launch.sh.  A fourth argument that is not a flag is the work directory (as in
# mmpretrain's script); further arguments go to tools/train.py, e.g. --resume or --amp.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: [GPUS=N] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [tools/train.py args]" >&2
    exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/slurm_launch.sh"
args=("$3")
rest=("${@:4}")
if [ ${#rest[@]} -gt 0 ] && [[ "${rest[0]}" != -* ]]; then
    args+=(--work-dir "${rest[0]}")
    rest=("${rest[@]:1}")
fi
# ${rest[@]+...}: an empty array is "unbound" under set -u in bash < 4.4
slurm_launch "$1" "$2" train.py "${args[@]}" --launcher slurm ${rest[@]+"${rest[@]}"}
