#!/usr/bin/env bash
# Create the venv that runs the real NeMo Gym for the interop suite.
#
#   interop/setup.sh [VENV_DIR]              # nemo-gym==0.4.0, Python 3.12 (default .interop-venv)
#   interop/setup.sh --nemo 0.7 [VENV_DIR]   # nemo-gym==0.7.0, Python 3.13 (default .interop07-venv)
#
# Idempotent: a venv whose stamp matches its requirements file is left alone. Packages come
# from PyPI (through pip's own configuration) only; NeMo Gym is never installed into rollgym's venv.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NEMO=0.4
if [ "${1:-}" = "--nemo" ]; then NEMO="${2:?--nemo needs 0.4 or 0.7}"; shift 2; fi

PIP_FLAGS=(--no-deps)
case "$NEMO" in
  0.4)
    VENV="${1:-$ROOT/.interop-venv}"
    REQS="$ROOT/interop/requirements.txt"
    CANDIDATES=("$HOME/.pyenv/versions/3.12.1/bin/python" python3.12)
    ;;
  0.7)
    VENV="${1:-$ROOT/.interop07-venv}"
    REQS="$ROOT/interop/requirements07.txt"
    CANDIDATES=("$HOME/.pyenv/versions/3.13.0/bin/python" python3.13)
    # The wheel declares Requires-Python >= 3.13.14; it runs on 3.13.0 (the interop suite is
    # the check), so pip is told not to refuse it.
    PIP_FLAGS+=(--ignore-requires-python)
    ;;
  *) echo "interop/setup.sh: --nemo takes 0.4 or 0.7, not $NEMO" >&2; exit 2 ;;
esac
STAMP="$VENV/.interop-installed"

# An explicit interpreter first (INTEROP_PYTHON), then pyenv's, then PATH.
PY="${INTEROP_PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in "${CANDIDATES[@]}"; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
[ -n "$PY" ] || { echo "interop/setup.sh: no Python for NeMo Gym $NEMO (set INTEROP_PYTHON)" >&2; exit 2; }

if [ -f "$STAMP" ] && cmp -s "$STAMP" "$REQS"; then
  echo "interop venv up to date: $VENV"
  exit 0
fi

# An existing venv (one being filled, or one from before the stamp) is kept: pip adds what is missing.
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# --no-deps with the full frozen list: exactly these versions, nothing re-resolved.
"$VENV/bin/pip" install -q "${PIP_FLAGS[@]}" -r "$REQS"
"$VENV/bin/python" -c "import nemo_gym, resources_servers.mcqa.app, math_verify" >/dev/null
cp "$REQS" "$STAMP"
echo "interop venv ready: $VENV (nemo-gym $NEMO)"
