#!/usr/bin/env bash
# Create the Python 3.12 venv that runs the real nemo-gym==0.4.0 for the interop suite.
#
#   interop/setup.sh [VENV_DIR]        # default: .interop-venv at the repo root
#
# Idempotent: a venv whose stamp matches interop/requirements.txt is left alone. Packages come
# from PyPI (through pip's own configuration) only; NeMo Gym is never installed into rollgym's venv.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.interop-venv}"
REQS="$ROOT/interop/requirements.txt"
STAMP="$VENV/.interop-installed"

# NeMo Gym 0.4.0 needs Python >= 3.12; prefer an explicit one, then pyenv's, then PATH.
PY="${INTEROP_PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in "$HOME/.pyenv/versions/3.12.1/bin/python" python3.12; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
[ -n "$PY" ] || { echo "interop/setup.sh: no Python 3.12 found (set INTEROP_PYTHON)" >&2; exit 2; }

if [ -f "$STAMP" ] && cmp -s "$STAMP" "$REQS"; then
  echo "interop venv up to date: $VENV"
  exit 0
fi

"$PY" -m venv "$VENV"
# --no-deps with the full frozen list: exactly these versions, nothing re-resolved.
"$VENV/bin/pip" install -q --no-deps -r "$REQS"
"$VENV/bin/python" -c "import nemo_gym, resources_servers.mcqa.app" >/dev/null
cp "$REQS" "$STAMP"
echo "interop venv ready: $VENV"
