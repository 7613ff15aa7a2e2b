#!/usr/bin/env bash
# Deploy a fleet file's PLMs to a Ray cluster with Ray Serve (see launch/README.md):
#
#   launch/serve_fleet.sh [FLEET.toml] [--ray-address ADDR] [--dir DIR] [--wait SECONDS]
#
# A thin wrapper of `wasp-vllm fleet up` (default file: launch/fleet.example.toml). The cluster must be
# running (`ray start --head` on one box). Prints the `--plms` value on stdout; DIR (default
# launch/fleet-state) holds fleet.json, plms.txt and run.yaml. Remove the PLMs with
# launch/stop_fleet.sh [--dir DIR].
set -euo pipefail
python_bin="${PYTHON:-python3}"
if [[ -z "${PYTHON:-}" && -x .venv/bin/python ]]; then
    python_bin=.venv/bin/python
fi
if (($# == 0)) || [[ "$1" == -* && "$1" != -h && "$1" != --help ]]; then
    set -- launch/fleet.example.toml "$@"
fi
exec "$python_bin" -m wasp_vllm fleet up "$@"
