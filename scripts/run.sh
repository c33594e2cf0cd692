#!/usr/bin/env bash
# Set up (if needed) and run the gateway with the embedded engine on the default settings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m gateway serve --config "${GATEWAY_CONFIG:-settings.toml}" "$@"
