#!/usr/bin/env bash
# Installs (idempotently) and runs one of mmlinvit's jobs.
#
#   bash tools/run.sh demo [args]   embedded end-to-end demo (tools/demo.py)
#   bash tools/run.sh test [args]   the test suite (pytest)
#   bash tools/run.sh python ARGS   any command with the project's interpreter
set -euo pipefail
REPO="$(CDPATH= cd -- "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/tools/install.sh"
PY="${MMLINVIT_VENV:-$HOME/.venvs/mmlinvit}/bin/python"
job="${1:-}"; shift || true
cd "$REPO"
case "$job" in
  demo) exec "$PY" tools/demo.py "$@" ;;
  test) exec "$PY" -m pytest tests -q -p no:cacheprovider "$@" ;;
  python) exec "$PY" "$@" ;;
  *) echo "usage: bash tools/run.sh {demo|test|python} [args]" >&2; exit 2 ;;
esac
