#!/usr/bin/env bash
# Remove the PLMs deployed by launch/serve_fleet.sh (`wasp-vllm fleet up`):
#
#   launch/stop_fleet.sh [--dir DIR] [--ray-address ADDR]
#
# A thin wrapper of `wasp-vllm fleet down`: deletes the Ray Serve application recorded in
# DIR/fleet.json (Ray stops its replicas). The cluster keeps running: `ray stop` ends it.
set -euo pipefail
python_bin="${PYTHON:-python3}"
if [[ -z "${PYTHON:-}" && -x .venv/bin/python ]]; then
    python_bin=.venv/bin/python
fi
exec "$python_bin" -m wasp_vllm fleet down "$@"
