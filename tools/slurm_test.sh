#!/usr/bin/env bash
# Evaluation on a Slurm cluster:  bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [args]
#
# GPUS (tasks in all, default 8), GPUS_PER_NODE, CPUS_PER_TASK, SRUN_ARGS, PORT and PYTHON as
# in tools/slurm_launch.sh; further arguments go to tools/test.py, e.g. --out or --tta.
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: [GPUS=N] bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py args]" >&2
    exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/slurm_launch.sh"
slurm_launch "$1" "$2" test.py "$3" "$4" --launcher slurm "${@:5}"
