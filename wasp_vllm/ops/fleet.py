"""A fleet file: the PLMs to serve on a Ray cluster, as Ray Serve deployments of vLLM engines.

``wasp-vllm fleet up FLEET.toml`` hands every ``[[plm]]`` of the file to Ray Serve's own LLM support
(``ray.serve.llm``): one deployment per PLM, with its replicas or autoscaling bounds, tensor parallel
size and resources per replica, all behind one OpenAI-compatible route (``/v1/completions``,
``/v1/chat/completions``) of the cluster's Serve proxy.  Ray places the replicas on the cluster's
nodes, health-checks them, restarts a dead one and routes each request to a live one; nothing in
this package does any of that.  The run calls the route like any OpenAI endpoint
(``name@http://head:8000/v1``), so the machine that runs ``generate`` (and holds the private data)
needs no Ray at all.

This module reads and checks the file and builds each PLM's ``LLMConfig`` (plain dicts, no Ray
import); :mod:`wasp_vllm.ops.ray_fleet` talks to the cluster.  The file::

    [ray]                      # where and how (all optional)
    address = "auto"           # the cluster: auto (RAY_ADDRESS / the local `ray start`), host:6379, ray://h:10001
    app = "wasp"               # the Serve application holding the PLMs
    route = "/"                # its route prefix (another fleet on the same cluster needs another)
    host = "127.0.0.1"         # address the Serve proxy binds (0.0.0.0: other machines; no auth!)
    port = 8000
    [[plm]]
    name = "smollm2"           # the PLM name of the run and the served model name
    model = "smollm2"          # a preset, a model directory on every node, an HF id or s3:// / gs:// URI
    replicas = 2               # or min_replicas / max_replicas: Ray Serve autoscales in between
    [run]                      # settings of `wasp-vllm generate` (run.yaml)
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from wasp_vllm.engines.devices import model_dtype

#: Share of a GPU a whole-card engine takes (as the in-process engines do); a fraction of a card
#: (``num_gpus`` < 1) gets that fraction of it.
GPU_SHARE = 0.9
RAY_KEYS = {"address", "app", "route", "host", "port", "public_host", "wait_s", "device"}
PLM_KEYS = {"name", "model", "replicas", "min_replicas", "max_replicas", "tensor_parallel_size", "num_cpus",
            "num_gpus", "accelerator_type", "max_model_len", "kv_cache_gib", "gpu_memory_utilization",
            "engine_kwargs", "env"}  # fmt: skip


class FleetError(RuntimeError):
    """The fleet file is wrong, the cluster cannot be reached, or a deployment did not start."""


@dataclass(frozen=True)
class PLMEntry:
    """One PLM of a fleet file: its served name, model, replicas and resources per replica."""

    name: str
    model: str
    replicas: int = 1
    min_replicas: int | None = None  # both bounds set: Ray Serve autoscales between them
    max_replicas: int | None = None
    tensor_parallel_size: int = 1
    num_cpus: float = 1.0  # logical CPUs per replica (Ray's count, not the threads vLLM uses)
    num_gpus: float = 1.0  # GPUs per tensor-parallel worker on a GPU cluster (< 1: a share of a card)
    accelerator_type: str | None = None  # e.g. "H100": only nodes with that GPU
    max_model_len: int = 2048
    kv_cache_gib: int = 2  # CPU clusters only (VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float | None = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RayTable:
    """The ``[ray]`` table: the cluster, the Serve application and where its proxy listens."""

    address: str = "auto"
    app: str = "wasp"
    route: str = "/"  # the application's route prefix: two fleets on one cluster need two routes
    host: str = "127.0.0.1"
    port: int = 8000
    public_host: str | None = None
    wait_s: float = 900.0
    device: str = "auto"


@dataclass(frozen=True)
class Fleet:
    """A fleet file: the PLMs, the ``[ray]`` table and optional run settings (``[run]``)."""

    plms: tuple[PLMEntry, ...]
    ray: RayTable = RayTable()
    run: dict[str, Any] = field(default_factory=dict)


# --- the fleet file ------------------------------------------------------------------------------


def _get(table: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    value = table.get(key, default)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
        raise FleetError(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def _positive(value: float | None, key: str, where: str) -> None:
    if value is not None and value <= 0:
        raise FleetError(f"{where}: {key} must be > 0")


def _entry(table: Any, i: int) -> PLMEntry:
    where = f"[[plm]] #{i + 1}"
    if not isinstance(table, dict):
        raise FleetError(f"{where} must be a table")
    if unknown := set(table) - PLM_KEYS:
        raise FleetError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(PLM_KEYS))})"
        )
    name = _get(table, "name", str, None, where)
    if not name or any(c in name for c in "@,| /"):
        raise FleetError(f"{where}: name is required, without '@', ',', '|', '/' or spaces")
    lo, hi = (_get(table, k, int, None, where) for k in ("min_replicas", "max_replicas"))
    if (lo is None) != (hi is None) or (
        lo is not None and hi is not None and not (0 <= lo <= hi and hi >= 1)
    ):
        raise FleetError(f"{where}: give both min_replicas and max_replicas, 0 <= min <= max, max >= 1")
    if lo is not None and "replicas" in table:
        raise FleetError(f"{where}: replicas or min_replicas/max_replicas, not both")
    entry = PLMEntry(
        name=name, model=_get(table, "model", str, name, where),
        replicas=_get(table, "replicas", int, 1, where), min_replicas=lo, max_replicas=hi,
        tensor_parallel_size=_get(table, "tensor_parallel_size", int, 1, where),
        num_cpus=float(_get(table, "num_cpus", (int, float), 1.0, where)),
        num_gpus=float(_get(table, "num_gpus", (int, float), 1.0, where)),
        accelerator_type=_get(table, "accelerator_type", str, None, where),
        max_model_len=_get(table, "max_model_len", int, 2048, where),
        kv_cache_gib=_get(table, "kv_cache_gib", int, 2, where),
        gpu_memory_utilization=_get(table, "gpu_memory_utilization", (float, int), None, where),
        engine_kwargs=dict(_get(table, "engine_kwargs", dict, {}, where)),
        env={str(k): str(v) for k, v in _get(table, "env", dict, {}, where).items()},
    )  # fmt: skip
    for key in ("replicas", "tensor_parallel_size", "num_cpus", "num_gpus", "max_model_len", "kv_cache_gib"):
        _positive(getattr(entry, key), key, where)
    if {"model", "served_model_name"} & set(entry.engine_kwargs):
        raise FleetError(f"{where}: engine_kwargs may not set model or served_model_name (use model, name)")
    return entry


def _ray_table(head: Any, path: Path) -> RayTable:
    if not isinstance(head, dict):
        raise FleetError(f"{path}: [ray] must be a table")
    if unknown := set(head) - RAY_KEYS:
        raise FleetError(
            f"[ray]: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(RAY_KEYS))})"
        )
    device = _get(head, "device", str, "auto", "[ray]")
    if device not in ("auto", "cpu", "gpu"):
        raise FleetError("[ray]: device must be auto, cpu or gpu")
    port = _get(head, "port", int, 8000, "[ray]")
    if not 0 < port < 65536:
        raise FleetError("[ray]: port must be a TCP port (1-65535)")
    route = _get(head, "route", str, "/", "[ray]")
    if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", route) or "//" in route:
        raise FleetError(f"[ray]: route must be a URL path starting with '/', e.g. /wasp (got {route!r})")
    return RayTable(_get(head, "address", str, "auto", "[ray]"), _get(head, "app", str, "wasp", "[ray]"),
                    route, _get(head, "host", str, "127.0.0.1", "[ray]"), port,
                    _get(head, "public_host", str, None, "[ray]"),
                    float(_get(head, "wait_s", (int, float), 900, "[ray]")), device)  # fmt: skip


def read_fleet(path: str | Path) -> Fleet:
    """Parse and check a fleet file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"fleet file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetError(f"fleet file {path} is not valid TOML: {exc}") from None
    if "fleet" in data:
        raise FleetError(
            f"{path}: [fleet] is gone; PLMs are served by Ray Serve now: write [ray] (launch/README.md)"
        )
    if unknown := set(data) - {"ray", "plm", "run"}:
        raise FleetError(
            f"{path}: unknown table(s) {', '.join(sorted(unknown))} (expected [ray], [[plm]], [run])"
        )
    entries = [_entry(table, i) for i, table in enumerate(data.get("plm", []))]
    if not entries:
        raise FleetError(f"{path}: no [[plm]] entry")
    if len({e.name for e in entries}) != len(entries):
        raise FleetError(f"{path}: each PLM name may appear once")
    run = data.get("run", {})
    if "plms" in run:
        raise FleetError("[run]: leave plms out; the fleet fills it in")
    return Fleet(tuple(entries), _ray_table(data.get("ray", {}), path), run)


# --- what Ray Serve is given ---------------------------------------------------------------------


def model_source(model: str) -> str:
    """Where the replicas load a model from: a packaged preset's local copy, a preset's HF id, a path.

    A packaged preset (``smollm2``, ``gemma3``) is dequantized here once and served from that folder,
    so it only works where the cluster's nodes see this machine's disk (one box, or a shared mount).
    A preset with a Hugging Face id is loaded by each node from its own cache (or the hub); a
    directory is passed as an absolute path (it must exist on every node); anything else (an HF id,
    ``s3://``, ``gs://``) goes to Ray Serve as given.
    """
    from wasp_vllm.engines.registry import PRESETS, packaged_model_dir

    preset = PRESETS.get(model)
    if preset is not None:
        if preset.seq2seq:
            raise FleetError(f"vLLM cannot serve {model} (encoder-decoder)")
        if preset.packaged:
            return str(packaged_model_dir(preset.packaged))
        assert preset.hf_id is not None
        return preset.hf_id
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def _deployment(e: PLMEntry, on_gpu: bool) -> dict[str, Any]:
    replicas: dict[str, Any] = {"num_replicas": e.replicas}
    if e.min_replicas is not None:
        replicas = {"autoscaling_config": {"min_replicas": e.min_replicas, "max_replicas": e.max_replicas}}
    # On a CPU cluster the replica actor holds the whole engine (vLLM's own worker processes are its
    # children), so it asks for the entry's CPUs; on a GPU cluster the bundles below hold the GPUs.
    return replicas | {"ray_actor_options": {"num_cpus": 0 if not on_gpu else 1}}


def llm_config(e: PLMEntry, source: str, on_gpu: bool) -> dict[str, Any]:
    """The ``ray.serve.llm.LLMConfig`` of one PLM, as a dict (the same flags a run's vLLM engine gets)."""
    tp = e.tensor_parallel_size
    # The number type as the in-process engine's: on a CPU cluster it follows this machine's CPU
    # (float32 where bf16 is emulated); nodes of another kind set ``engine_kwargs = {dtype = ...}``.
    dtype = model_dtype("auto", "cuda" if on_gpu else "cpu")
    engine: dict[str, Any] = {"dtype": dtype, "max_model_len": e.max_model_len, "seed": 0,
                              "enable_prefix_caching": True, "tensor_parallel_size": tp}  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1"} | e.env
    if on_gpu:
        share = e.gpu_memory_utilization or round(GPU_SHARE * min(e.num_gpus, 1.0), 3)
        engine["gpu_memory_utilization"] = share
        bundle: dict[str, float] = {"GPU": e.num_gpus}
    else:
        # As the in-process CPU engine: eager, and no chunked prefill (a prompt split over steps makes
        # vllm-cpu rewind a seeded generator, which it cannot: "CPU Generator does not use offset").
        engine |= {"enforce_eager": True, "enable_chunked_prefill": False,
                   "max_num_batched_tokens": max(e.max_model_len, 8192)}  # fmt: skip
        env["VLLM_CPU_KVCACHE_SPACE"] = str(e.kv_cache_gib)
        bundle = {"CPU": e.num_cpus / tp}
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": e.name, "model_source": source},
        "accelerator_config": {"kind": "gpu" if on_gpu else "cpu"},
        "deployment_config": _deployment(e, on_gpu),
        "placement_group_config": {"bundles": [dict(bundle) for _ in range(tp)], "strategy": "PACK"},
        "engine_kwargs": engine | e.engine_kwargs,
        "runtime_env": {"env_vars": env},
    }
    if on_gpu and e.accelerator_type:
        config["accelerator_type"] = e.accelerator_type
    return config


def public_url(ray: RayTable) -> str:
    """The OpenAI route a run calls: the Serve proxy's address as other machines reach it."""
    host = ray.public_host or (socket.getfqdn() if ray.host == "0.0.0.0" else ray.host)
    return f"http://{host}:{ray.port}{ray.route.rstrip('/')}/v1"


def plms_value(fleet: Fleet) -> str:
    """``name@URL,...``: the ``--plms`` value of the fleet (every PLM behind the one Serve route)."""
    url = public_url(fleet.ray)
    return ",".join(f"{e.name}@{url}" for e in fleet.plms)
