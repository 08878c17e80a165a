#!/usr/bin/env bash
# Distributed evaluation with torchrun:  bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [args]
#
# Honours NNODES, NODE_RANK, PORT and MASTER_ADDR like tools/dist_train.sh; PYTHON selects
# the interpreter (default: python).  The launch itself: tools/dist_launch.sh.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [tools/test.py args]" >&2
    exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/dist_launch.sh"
dist_launch "$3" test.py "$1" "$2" --launcher pytorch "${@:4}"
