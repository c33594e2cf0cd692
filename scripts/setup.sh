#!/usr/bin/env bash
# Set up a fresh machine: redis-server (for the embedded fallback), a virtualenv in .venv with
# the CPU build of torch, and this package with its dev tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

# PostgreSQL: the usage store's cluster backend; its tests start a server of their own.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq postgresql >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# CPU torch: pinned here, not in the package (GPU users bring their own torch).
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch==2.13.0" \
        || .venv/bin/python -m pip install -q "torch==2.13.0" \
               --index-url https://download.pytorch.org/whl/cpu
fi
.venv/bin/python -m pip install -q -e ".[dev]"

# Chromium: the admin console's end-to-end tests drive it through Playwright (executable_path).
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
