#!/usr/bin/env bash
# What rollgym's container runtime needs, installed where missing: podman, runc, mmdebstrap and
# busybox-static (the Harbor verifier's harness, /bin/busybox) from Debian (quietly; only as root where apt-get exists), then the base image built once
# (localhost/rollgym-base:<digest of its recipe>; about a minute the first time, cached after).
# Called by .ci/run and `make test` before pytest. Never fails the caller: when something
# cannot be done it says so in one line, and the container tests skip or fail with the reason.
#   scripts/install_containers.sh [PYTHON]     (default: .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
missing=()
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# A static busybox, by its path (a dynamic one, from the busybox package, would not do).
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") \
      >/dev/null 2>&1 || echo "could not install ${missing[*]} with apt-get: the container tests will skip"
  else
    echo "${missing[*]} missing and not installable here (needs root and apt-get): the container tests will skip"
    exit 0
  fi
fi
if [ "$(id -u)" != 0 ]; then
  echo "not root: rollgym's container tests run rootful podman and will skip"
  exit 0
fi
# Without rollgym's Python yet (.ci/run calls this before `make install`), the base image is
# built by the next call (`make test`'s).
if [ -x "$PY" ] && command -v podman >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout 1200 "$PY" -c \
    "from rollgym.containers.images import ensure_base; ensure_base()" >/dev/null \
    || echo "the base image could not be built (is deb.debian.org reachable?): the container tests will fail saying why"
fi
exit 0
