#!/usr/bin/env bash
# Set up (if needed) and run the gateway with the embedded engine on the default settings.
# It listens at once; the engine loads behind it (on a first start the demo is trained, minutes):
# `curl localhost:8000/readyz` says what is loading and how far, and turns 200 when it serves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m gateway serve --config "${GATEWAY_CONFIG:-settings.toml}" "$@"
