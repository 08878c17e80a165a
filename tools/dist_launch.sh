# Shared torchrun launcher of tools/dist_train.sh and tools/dist_test.sh (sourced, not run).
#
#   dist_launch NPROC SCRIPT [SCRIPT args]   runs tools/SCRIPT on NPROC processes per node
#
# Multi-node: run once per node with the same MASTER_ADDR / PORT and NNODES, and NODE_RANK
# set to 0..NNODES-1 (defaults: 1 node, rank 0, 127.0.0.1:29500; PORT falls back to
# MASTER_PORT).  Two jobs on one machine need two PORTs.  PYTHON selects the interpreter
# (default: python); the repository is put first on PYTHONPATH.
dist_launch() {
    local nproc=$1 script=$2
    local root
    root="$(CDPATH= cd -- "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" \
    "${PYTHON:-python}" -m torch.distributed.run \
        --nnodes="${NNODES:-1}" \
        --node_rank="${NODE_RANK:-0}" \
        --master_addr="${MASTER_ADDR:-127.0.0.1}" \
        --nproc_per_node="$nproc" \
        --master_port="${PORT:-${MASTER_PORT:-29500}}" \
        "$root/tools/$script" "${@:3}"
}
