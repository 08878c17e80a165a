#!/usr/bin/env bash
# Idempotent installer for mmlinvit and its pinned OpenMMLab (OneDL) stack.
#
# Creates (or re-uses) a virtual environment, installs torch, the OneDL forks of
# OpenMMLab (compiling onedl-mmcv with its ops under a C++20 compiler wrapper),
# the test tools, and mmlinvit itself in editable mode.  A second run with
# everything in place only checks versions and returns in a few seconds.
#
# Environment:
#   MMLINVIT_VENV   where the virtual environment lives (default ~/.venvs/mmlinvit)
#   PYTHON          interpreter used to create the venv (default python3.11 or python3)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMLINVIT_VENV:-$HOME/.venvs/mmlinvit}"
PY_BOOT="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PIN_FILE="$REPO/tools/requirements/stack.txt"
STAMP="$VENV/.mmlinvit-stack-$(sha1sum "$PIN_FILE" | cut -c1-12)"

log() { echo "[install] $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment at $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

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
  log "installing build tools"
  "${PIP[@]}" install -q 'pip>=24' 'setuptools>=77,<82' wheel ninja
  log "installing torch / torchvision / triton"
  "${PIP[@]}" install -q torch==2.14.1 torchvision==0.29.1
  "${PIP[@]}" install -q -r "$REPO/tools/requirements/build.txt"

  if ! "$PY" -c "import mmcv, mmcv.ops" >/dev/null 2>&1 || \
     [ "$("$PY" -c 'from importlib.metadata import version; print(version("onedl-mmcv"))' 2>/dev/null)" != "2.3.6" ]; then
    log "building onedl-mmcv 2.3.6 with ops (about 8 min on 2 cores; cached as a wheel afterwards)"
    WRAP_DIR="$(mktemp -d)"
    cat > "$WRAP_DIR/cxx20" <<'WEOF'
#!/usr/bin/env bash
# torch 2.14 headers need C++20; mmcv's setup.py asks for an older standard.
args=()
for a in "$@"; do
  case "$a" in
    -std=c++14|-std=c++17|-std=gnu++14|-std=gnu++17) args+=("-std=c++20");;
    *) args+=("$a");;
  esac
done
exec g++ "${args[@]}"
WEOF
    chmod +x "$WRAP_DIR/cxx20"
    CXX="$WRAP_DIR/cxx20" MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" FORCE_CUDA=0 \
      "${PIP[@]}" install --no-build-isolation onedl-mmcv==2.3.6
  fi
  log "installing OpenMMLab (OneDL) packages and test tools"
  "${PIP[@]}" install -q -r "$PIN_FILE"
  touch "$STAMP"
fi

# Checked from / so that the current directory cannot shadow the installed package.
installed_at="$(cd / && "$PY" -c 'import mmlinvit, os; print(os.path.dirname(os.path.dirname(os.path.realpath(mmlinvit.__file__))))' 2>/dev/null || true)"
if [ "$installed_at" != "$REPO" ]; then
  log "installing mmlinvit (editable) from $REPO"
  "${PIP[@]}" install -q --no-build-isolation --no-deps -e "$REPO"
fi
log "ready: $PY"
