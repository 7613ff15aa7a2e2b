#!/usr/bin/env bash
# Stop a fleet started by launch/serve_fleet.sh.
#
#   launch/stop_fleet.sh [--dir DIR] [--timeout SECONDS]   (DIR defaults to launch/fleet-state)
#
# Sends SIGTERM to the process group of every server listed in DIR/fleet.pids (each server was
# started with setsid, so its group holds the server and the engine processes it spawned, and
# nothing else), waits up to --timeout seconds (default 60), then sends SIGKILL to what is left,
# and removes the pid file. Logs stay in DIR/logs.
set -euo pipefail

dir=launch/fleet-state
timeout_s=60
while (($#)); do
    case "$1" in
        --dir) dir="$2"; shift 2 ;;
        --timeout) timeout_s="$2"; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "stop_fleet: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

pidfile="$dir/fleet.pids"
if [[ ! -s "$pidfile" ]]; then
    echo "stop_fleet: no fleet recorded in $pidfile"
    exit 0
fi

alive() { kill -0 -- "-$1" 2>/dev/null || kill -0 "$1" 2>/dev/null; }

pids=()
while read -r pid name port gpu; do
    [[ -n "$pid" ]] || continue
    pids+=("$pid")
    if alive "$pid"; then
        echo "stopping $name (pid $pid, port $port, gpu $gpu)"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
done <"$pidfile"

deadline=$((SECONDS + timeout_s))
for pid in "${pids[@]}"; do
    while alive "$pid" && ((SECONDS < deadline)); do
        sleep 1
    done
    if alive "$pid"; then
        echo "pid $pid still running after ${timeout_s}s: SIGKILL"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
done
rm -f "$pidfile" "$dir/plms.txt"
echo "fleet stopped"
