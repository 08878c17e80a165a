#!/usr/bin/env bash
# Distributed training with torchrun:  bash tools/dist_train.sh CONFIG NPROC [train.py args]
#
# Multi-node: run once per node with the same MASTER_ADDR / PORT and NNODES, and NODE_RANK
# set to 0..NNODES-1.  CPU-only machines train with the gloo backend automatically.
# PYTHON selects the interpreter (default: python).  The launch itself: tools/dist_launch.sh.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash tools/dist_train.sh CONFIG NPROC [tools/train.py args]" >&2
    exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/dist_launch.sh"
dist_launch "$2" train.py "$1" --launcher pytorch "${@:3}"
