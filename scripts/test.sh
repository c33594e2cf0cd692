#!/usr/bin/env bash
# Set up (if needed) and run the whole suite: lint, types, tests. CI runs exactly this.
#   bash scripts/test.sh            everything
#   bash scripts/test.sh --quick    lint, types and the tests not marked slow (the quick loop)
# Other arguments go to pytest (e.g. a path or -k EXPR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
marks=()
if [ "${1:-}" = "--quick" ]; then
    shift
    marks=(-m "not slow")
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q "${marks[@]}" "$@"
