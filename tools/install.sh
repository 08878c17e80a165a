#!/usr/bin/env bash
# Idempotent installer for mmlinvit and its pinned OpenMMLab (OneDL) stack.
#
# Creates (or re-uses) a virtual environment, installs torch, the OneDL forks of
# OpenMMLab (compiling onedl-mmcv with its ops under a C++20 compiler wrapper),
# the test tools, and mmlinvit itself in editable mode.  A second run with
# everything in place only checks versions and returns in a few seconds.
#
# Cold install: 20-36 min wall measured on fresh 2-core machines, nearly all of it compiling
# onedl-mmcv's 78 C++ op files (progress is printed: objects compiled / total, elapsed); that
# was with debug info (-g), which the compiler wrapper below now drops (half the CPU time per
# file).
# onedl-mmcv always compiles all of its ops (its setup.py has no switch for a subset, and
# mmcv.ops loads every op's symbols when mmseg / mmdet import it), so nothing is skipped.
#
# Environment:
#   MMLINVIT_VENV   where the virtual environment lives (default ~/.venvs/mmlinvit)
#   PYTHON          interpreter used to create the venv (default python3.11 or python3)
#   MAX_JOBS        parallel compile jobs for onedl-mmcv (default: all cores, $(nproc))
set -euo pipefail

REPO="$(CDPATH= cd -- "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${MMLINVIT_VENV:-$HOME/.venvs/mmlinvit}"
PY_BOOT="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PIN_FILE="$REPO/tools/requirements/stack.txt"
STAMP="$VENV/.mmlinvit-stack-$(sha1sum "$PIN_FILE" | cut -c1-12)"
JOBS="${MAX_JOBS:-$(nproc)}"

log() { echo "[install] $*" >&2; }
elapsed() { local s=$(( SECONDS - $1 )); printf '%dm%02ds' $(( s / 60 )) $(( s % 60 )); }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment at $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# Reads `pip -v` output of the onedl-mmcv build: keeps it in a log file and prints ninja's
# "[finished/total]" status as progress lines.
mmcv_progress() {
  local t0=$SECONDS line last=-1
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$MMCV_LOG"
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\  ]] && [ "${BASH_REMATCH[1]}" != "$last" ]; then
      last=${BASH_REMATCH[1]}
      log "onedl-mmcv ops: ${BASH_REMATCH[1]}/${BASH_REMATCH[2]} objects compiled, $(elapsed "$t0") elapsed"
    elif [[ $line == *"Successfully installed"* || $line == *"Created wheel for"* ]]; then
      log "${line#"${line%%[![:space:]]*}"} ($(elapsed "$t0"))"
    fi
  done
}

if [ -f "$STAMP" ] && "$PY" - "$PIN_FILE" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for line in open(sys.argv[1]):
    line = line.split('#')[0].strip()
    if not line or '==' not in line:
        continue
    name, want = line.split('==')
    try:
        have = version(name)
    except PackageNotFoundError:
        ok = False; break
    if have.split('+')[0] != want:
        ok = False; break
sys.exit(0 if ok else 1)
PYEOF
then
  log "stack already installed in $VENV"
else
  T0=$SECONDS
  log "installing build tools"
  "${PIP[@]}" install -q 'pip>=24' 'setuptools>=77,<82' wheel ninja
  log "installing torch / torchvision / triton"
  "${PIP[@]}" install -q torch==2.14.1 torchvision==0.29.1
  "${PIP[@]}" install -q -r "$REPO/tools/requirements/build.txt"

  if ! "$PY" -c "import mmcv, mmcv.ops" >/dev/null 2>&1 || \
     [ "$("$PY" -c 'from importlib.metadata import version; print(version("onedl-mmcv"))' 2>/dev/null)" != "2.3.6" ]; then
    MMCV_LOG="$VENV/onedl-mmcv-build.log"
    : > "$MMCV_LOG"
    log "building onedl-mmcv 2.3.6 with its ops on $JOBS parallel jobs (the long step: 20-36 min" \
        "on 2 cores measured with -g, less without; pip caches the wheel afterwards)." \
        "Full compiler output: $MMCV_LOG"
    WRAP_DIR="$(mktemp -d)"
    cat > "$WRAP_DIR/cxx20" <<'WEOF'
#!/usr/bin/env bash
# torch 2.14 headers need C++20; mmcv's setup.py asks for an older standard.
# -g (from Python's build flags) is dropped: debug info doubles the compile time of every
# op file (measured 18 s -> 9 s CPU for nms.cpp) and nothing needs it.
args=()
for a in "$@"; do
  case "$a" in
    -std=c++14|-std=c++17|-std=gnu++14|-std=gnu++17) args+=("-std=c++20");;
    -g) ;;
    *) args+=("$a");;
  esac
done
exec g++ "${args[@]}"
WEOF
    chmod +x "$WRAP_DIR/cxx20"
    if ! CXX="$WRAP_DIR/cxx20" MAX_JOBS="$JOBS" NINJA_STATUS='[%f/%t] ' FORCE_CUDA=0 \
        "${PIP[@]}" install -v --no-build-isolation onedl-mmcv==2.3.6 2>&1 | mmcv_progress; then
      log "building onedl-mmcv failed; last lines of $MMCV_LOG:"
      tail -n 40 "$MMCV_LOG" >&2
      exit 1
    fi
  fi
  log "installing OpenMMLab (OneDL) packages and test tools"
  "${PIP[@]}" install -q -r "$PIN_FILE"
  touch "$STAMP"
  log "stack installed in $(elapsed "$T0")"
fi

# mmlinvit itself, editable; also redone when the configs are not linked into the package
# (mmlinvit/.mim, made by setup.py; `_base_ = ['mmlinvit::...']` reads them).  Checked from /
# so that the current directory cannot shadow the installed package.
installed_at="$(cd / && "$PY" -c 'import mmlinvit, os; print(os.path.dirname(os.path.dirname(os.path.realpath(mmlinvit.__file__))))' 2>/dev/null || true)"
if [ "$installed_at" != "$REPO" ] || [ ! -e "$REPO/mmlinvit/.mim/configs" ] || \
   [ ! -e "$REPO/mmlinvit/.mim/model-index.yml" ]; then
  log "installing mmlinvit (editable) from $REPO"
  "${PIP[@]}" install -q --no-build-isolation --no-deps -e "$REPO"
fi
log "ready: $PY"
