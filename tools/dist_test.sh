#!/usr/bin/env bash
# Distributed evaluation with torchrun:  bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [args]
#
# Honours NNODES, NODE_RANK, PORT and MASTER_ADDR like tools/dist_train.sh; PYTHON selects
# the interpreter (default: python).
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
"${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$ROOT/tools/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "${@:4}"
