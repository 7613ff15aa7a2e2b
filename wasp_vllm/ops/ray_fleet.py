"""Deploy a fleet file's PLMs to a Ray cluster with Ray Serve, report on them, delete them.

``up`` connects to the cluster (``ray.init(address=...)``), starts Ray Serve's proxy where the
``[ray]`` table says, hands ``ray.serve.llm.build_openai_app`` one ``LLMConfig`` per PLM and waits
until Ray Serve reports the application ``RUNNING`` (or failed, or the wait is over: then the
application is deleted again and the error names each deployment's own message).  Everything after
that (placing replicas, health checks, restarts, routing, autoscaling) is Ray's.  ``status`` is
``serve.status()`` of the application; ``down`` is ``serve.delete`` of it.  The cluster itself is the
operator's (``ray start`` / ``ray stop``, KubeRay): nothing here starts or stops it.

Ray is an optional dependency (``pip install -e ".[ray]"``); only these commands import it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wasp_vllm.ops.fleet import Fleet, FleetError, llm_config, model_source, plms_value

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("launch/fleet-state")
STATE = "fleet.json"
#: How long a cluster address may take to accept a TCP connection before it counts as unreachable.
CONNECT_TIMEOUT_S = 5.0


def _ray() -> Any:
    try:
        import ray
        from ray import serve  # noqa: F401 - the extra installs both; fail here if only ray is there
    except ImportError:
        raise FleetError(
            'Ray Serve is not installed: pip install -e ".[ray]" (or `make test` sets it up)'
        ) from None
    return ray


def _check_address(address: str) -> None:
    """Fail fast on an address nothing listens at (``ray.init`` would retry for minutes)."""
    if address == "local":
        raise FleetError(
            "address 'local' would start a cluster that ends with this command: `ray start --head`"
        )
    if address in ("auto", ""):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise FleetError(f"Ray address {address!r} is not host:port, ray://host:port or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise FleetError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with `ray start --head` "
            "and pass the address it prints (or auto)"
        ) from None


@contextlib.contextmanager
def connected(address: str) -> Iterator[Any]:
    """A driver connection to the cluster at ``address``, closed again on exit (the cluster stays)."""
    ray = _ray()
    _check_address(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        cause = str(exc.__cause__ or exc).splitlines()[0][:400]
        hint = ""
        if "Authentication" in cause or "token" in cause.lower():
            hint = (
                " The cluster wants its token: set RAY_AUTH_MODE=token (the token is read from"
                " ~/.ray/auth_token or RAY_AUTH_TOKEN), or pass --ray-address auto on the head node."
            )
        raise FleetError(f"cannot connect to the Ray cluster at {address}: {cause}.{hint}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _on_gpu(ray: Any, device: str) -> bool:
    if device != "auto":
        return device == "gpu"
    return float(ray.cluster_resources().get("GPU", 0)) > 0


def build_app(fleet: Fleet, sources: dict[str, str], on_gpu: bool) -> Any:
    """The Ray Serve application: one ``ray.serve.llm`` deployment per PLM behind one OpenAI route."""
    from ray.serve.llm import LLMConfig, build_openai_app

    configs = [LLMConfig(**llm_config(e, sources[e.name], on_gpu)) for e in fleet.plms]
    return build_openai_app({"llm_configs": configs})


def _deployments(app: Any) -> list[dict[str, Any]]:
    return [
        {"deployment": name, "status": str(getattr(d.status, "value", d.status)),
         "replicas": dict(d.replica_states), "message": d.message}
        for name, d in sorted(app.deployments.items())
    ]  # fmt: skip


def _wait_running(serve: Any, name: str, wait_s: float) -> None:
    """Until Ray Serve reports the application RUNNING; a failed or late one raises with its messages."""
    deadline = time.monotonic() + wait_s
    while True:
        app = serve.status().applications.get(name)
        status = str(getattr(app.status, "value", app.status)) if app else "NOT_STARTED"
        if status == "RUNNING":
            return
        late = time.monotonic() > deadline
        if status == "DEPLOY_FAILED" or late:
            rows = _deployments(app) if app else []
            detail = "\n".join(
                f"  {r['deployment']}: {r['status']} {r['replicas']} {r['message']}" for r in rows
            )
            why = "failed to deploy" if not late else f"is not running after {wait_s:.0f} s"
            raise FleetError(
                f"Ray Serve application {name!r} {why} ({status}):\n{detail or (app.message if app else '')}"
            )
        time.sleep(2.0)


def up(fleet: Fleet, directory: Path = DEFAULT_DIR, *, address: str | None = None,
       wait_s: float | None = None) -> str:  # fmt: skip
    """Deploy the fleet's PLMs to the cluster; returns the ``--plms`` value (also in ``directory``)."""
    address = address or os.environ.get("RAY_ADDRESS") or fleet.ray.address
    name = fleet.ray.app
    _check_address(address)  # before the models: preparing a packaged one can take a minute
    sources = {e.name: model_source(e.model) for e in fleet.plms}  # a wrong model fails before Ray
    with connected(address) as ray:
        from ray import serve

        on_gpu = _on_gpu(ray, fleet.ray.device)
        app = build_app(fleet, sources, on_gpu)
        serve.start(http_options={"host": fleet.ray.host, "port": fleet.ray.port})
        if name in serve.status().applications:
            raise FleetError(f"application {name!r} is already deployed: `wasp-vllm fleet down` first")
        log.info("deploying %d PLM(s) as Ray Serve application %r (%s)", len(fleet.plms), name,
                 "GPU" if on_gpu else "CPU")  # fmt: skip
        try:
            target = serve.RunTarget(target=app, name=name, route_prefix=fleet.ray.route)
            serve.run_many(
                [target], wait_for_ingress_deployment_creation=False, wait_for_applications_running=False
            )
            _wait_running(serve, name, fleet.ray.wait_s if wait_s is None else wait_s)
        except BaseException:
            with contextlib.suppress(Exception):
                serve.delete(name)  # nothing half-deployed stays behind
            raise
    plms = plms_value(fleet)
    write_state(directory, {"address": address, "app": name, "plms": plms}, fleet.run)
    return plms


def write_state(directory: Path, state: dict[str, Any], run: dict[str, Any] | None = None) -> None:
    """``fleet.json`` (cluster address, application, --plms value), ``plms.txt`` and ``run.yaml``."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    (directory / STATE).write_text(json.dumps({"version": 2, **state}, indent=1) + "\n")
    (directory / "plms.txt").write_text(state["plms"] + "\n")
    if run is not None:
        run_file = {**run, "plms": state["plms"].split(",")}
        (directory / "run.yaml").write_text(yaml.safe_dump(run_file, sort_keys=False))


def read_state(directory: Path) -> dict[str, Any] | None:
    """What ``up`` recorded in ``directory``, or None."""
    path = directory / STATE
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    if state.get("version") != 2:
        raise FleetError(f"{path} was written by the old process fleet; remove {directory} and run fleet up")
    return dict(state)


def _target(directory: Path, address: str | None) -> tuple[str, str] | None:
    state = read_state(directory)
    if state is None:
        return None
    return address or state["address"], state["app"]


def status(directory: Path = DEFAULT_DIR, address: str | None = None) -> list[dict[str, Any]]:
    """Each deployment of the recorded application: Ray Serve's status and replica states."""
    target = _target(directory, address)
    if target is None:
        return []
    address, name = target
    with connected(address):
        from ray import serve

        app = serve.status().applications.get(name)
        return _deployments(app) if app else []


def down(directory: Path = DEFAULT_DIR, address: str | None = None) -> str | None:
    """Delete the recorded application from the cluster (``serve.delete``); its name, or None."""
    target = _target(directory, address)
    if target is None:
        return None
    address, name = target
    with connected(address):
        from ray import serve

        serve.delete(name)
    for file in (STATE, "plms.txt", "run.yaml"):
        (directory / file).unlink(missing_ok=True)
    return name
