# Shared srun launcher of tools/slurm_train.sh and tools/slurm_test.sh (sourced, not run).
#
#   slurm_launch PARTITION JOB_NAME SCRIPT [SCRIPT args]   runs tools/SCRIPT as GPUS tasks
#
# Environment (the variables of mmseg's / mmpretrain's slurm scripts, with mmpretrain's
# defaults): GPUS (tasks in all, default 8),
# GPUS_PER_NODE (default min(GPUS, 8)), CPUS_PER_TASK (default 5), SRUN_ARGS (extra srun
# flags, e.g. "--quotatype=auto"), PORT (master port; default MASTER_PORT, else 29500),
# PYTHON (default: python).
# Each task is one process on one GPU; mmengine reads SLURM_PROCID / SLURM_NTASKS /
# SLURM_NODELIST (--launcher slurm), so the same command scales to several nodes.
slurm_launch() {
    local partition=$1 job_name=$2 script=$3
    local root gpus gpus_per_node
    root="$(CDPATH= cd -- "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    gpus=${GPUS:-8}
    gpus_per_node=${GPUS_PER_NODE:-$(( gpus < 8 ? gpus : 8 ))}
    # SRUN_ARGS is split into words on purpose (several flags in one variable).
    # shellcheck disable=SC2086
    PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" MASTER_PORT="${PORT:-${MASTER_PORT:-29500}}" \
    srun -p "$partition" \
        --job-name="$job_name" \
        --gres="gpu:$gpus_per_node" \
        --ntasks="$gpus" \
        --ntasks-per-node="$gpus_per_node" \
        --cpus-per-task="${CPUS_PER_TASK:-5}" \
        --kill-on-bad-exit=1 \
        ${SRUN_ARGS:-} \
        "${PYTHON:-python}" -u "$root/tools/$script" "${@:4}"
}
