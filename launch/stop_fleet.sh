#!/usr/bin/env bash
# Stop the fleet started by launch/serve_fleet.sh (`wasp-vllm fleet up`):
#
#   launch/stop_fleet.sh [--dir DIR] [--timeout SECONDS]
#
# A thin wrapper of `wasp-vllm fleet down`: SIGTERM to the process group of every server recorded
# in DIR/fleet.json (the server and the engine processes it spawned, nothing else), SIGKILL to what
# is left after --timeout seconds (default 60). Logs stay in DIR/logs.
set -euo pipefail
python_bin="${PYTHON:-python3}"
if [[ -z "${PYTHON:-}" && -x .venv/bin/python ]]; then
    python_bin=.venv/bin/python
fi
exec "$python_bin" -m wasp_vllm fleet down "$@"
