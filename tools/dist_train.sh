#!/usr/bin/env bash
# Distributed training with torchrun:  bash tools/dist_train.sh CONFIG NPROC [train.py args]
#
# Multi-node: run once per node with the same MASTER_ADDR / PORT and NNODES, and NODE_RANK
# set to 0..NNODES-1.  CPU-only machines train with the gloo backend automatically.
# PYTHON selects the interpreter (default: python).
set -euo pipefail
CONFIG=$1
NPROC=$2
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
    "$ROOT/tools/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
