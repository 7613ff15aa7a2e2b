"""The fleet without a cluster: the fleet file, the Ray Serve LLM configs built from it, the CLI's errors.

The real deployments (a local Ray cluster on 127.0.0.1, the packaged models on vllm-cpu) are in
``test_ray.py``; the plain OpenAI-endpoint path against servers a user runs is in ``test_served.py``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from wasp_vllm.cli import app
from wasp_vllm.engines.devices import model_dtype
from wasp_vllm.engines.registry import parse_plm
from wasp_vllm.ops import fleet, ray_fleet

EXAMPLE = Path(__file__).resolve().parents[1] / "launch" / "fleet.example.toml"


def write_fleet(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(textwrap.dedent(text))
    return path


def said(result) -> str:
    """What the command printed, with rich's line wrapping undone."""
    return " ".join(result.output.split())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_example_fleet_file_reads_with_its_ray_table_and_run_settings():
    f = fleet.read_fleet(EXAMPLE)
    assert [(p.name, p.model, p.replicas) for p in f.plms] == [
        ("smollm2", "smollm2", 2),
        ("gemma3", "gemma3", 1),
    ]
    assert f.ray == fleet.RayTable(address="auto", app="wasp", host="127.0.0.1", port=8000, wait_s=900.0)
    assert f.run["n"] == 6000 and "plms" not in f.run
    assert fleet.plms_value(f) == "smollm2@http://127.0.0.1:8000/v1,gemma3@http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[plm]]\nname='a'\nport=1\n", "unknown key"),
        ("[[plm]]\nname='a'\n[[plm]]\nname='a'\n", "each PLM name may appear once"),
        ("[[plm]]\nname='a@b'\n", "without '@'"),
        ("[[plm]]\nname='a'\nreplicas=0\n", "replicas must be > 0"),
        ("[[plm]]\nname='a'\nmin_replicas=1\n", "give both min_replicas and max_replicas"),
        ("[[plm]]\nname='a'\nmin_replicas=3\nmax_replicas=2\n", "0 <= min <= max"),
        ("[[plm]]\nname='a'\nreplicas=2\nmin_replicas=1\nmax_replicas=2\n", "not both"),
        ("[[plm]]\nname='a'\nengine_kwargs={model='x'}\n", "may not set model"),
        ("[[plm]]\nname='a'\n[run]\nplms=['x']\n", "leave plms out"),
        ("[ray]\ndevice='tpu'\n[[plm]]\nname='a'\n", "device must be"),
        ("[ray]\nport=70000\n[[plm]]\nname='a'\n", "port must be"),
        ("[ray]\nroute='wasp'\n[[plm]]\nname='a'\n", "route must be a URL path"),
        ("[ray]\nroute='/a b'\n[[plm]]\nname='a'\n", "route must be a URL path"),
        ("[ray]\nadress='x'\n[[plm]]\nname='a'\n", "unknown key"),
        ("[fleet]\nhost='x'\n[[plm]]\nname='a'\n", "[fleet] is gone"),
        ("[ray]\n", "no [[plm]] entry"),
        ("[[plm]]\nname='a'\nmax_model_len='big'\n", "wrong type"),
        ("[[plm]\n", "not valid TOML"),
    ],
)
def test_a_wrong_fleet_file_is_refused_with_a_reason(tmp_path, text, message):
    with pytest.raises(fleet.FleetError, match=message.replace("[", r"\[")):
        fleet.read_fleet(write_fleet(tmp_path, text))


def test_a_cpu_plm_gets_the_in_process_engine_s_cpu_flags_and_its_replicas():
    entry = fleet.PLMEntry(name="tiny", model="tiny", replicas=2, num_cpus=1.5, kv_cache_gib=3,
                           max_model_len=1024, engine_kwargs={"max_num_seqs": 8}, env={"X": "1"})  # fmt: skip
    cfg = fleet.llm_config(entry, "/models/tiny", on_gpu=False)
    assert cfg["model_loading_config"] == {"model_id": "tiny", "model_source": "/models/tiny"}
    assert cfg["accelerator_config"] == {"kind": "cpu"} and "accelerator_type" not in cfg
    assert cfg["deployment_config"] == {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0}}
    assert cfg["placement_group_config"] == {"bundles": [{"CPU": 1.5}], "strategy": "PACK"}
    engine = cfg["engine_kwargs"]
    assert engine["enforce_eager"] is True and engine["enable_chunked_prefill"] is False
    assert engine["max_num_batched_tokens"] == 8192 and engine["max_model_len"] == 1024
    assert engine["enable_prefix_caching"] is True and engine["max_num_seqs"] == 8
    assert "gpu_memory_utilization" not in engine
    assert engine["dtype"] == model_dtype("auto", "cpu")  # as in-process: float32 without native bf16
    assert cfg["runtime_env"]["env_vars"] == {"HF_HUB_OFFLINE": "1", "X": "1", "VLLM_CPU_KVCACHE_SPACE": "3"}


def test_a_gpu_plm_gets_tensor_parallel_bundles_a_card_share_and_autoscaling_bounds():
    entry = fleet.PLMEntry(name="big", model="big", min_replicas=1, max_replicas=4, tensor_parallel_size=2,
                           num_gpus=0.5, accelerator_type="H100")  # fmt: skip
    cfg = fleet.llm_config(entry, "org/big", on_gpu=True)
    assert cfg["deployment_config"]["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert "num_replicas" not in cfg["deployment_config"]
    assert cfg["placement_group_config"]["bundles"] == [{"GPU": 0.5}, {"GPU": 0.5}]
    assert cfg["engine_kwargs"]["tensor_parallel_size"] == 2 and cfg["engine_kwargs"]["dtype"] == "bfloat16"
    assert cfg["engine_kwargs"]["gpu_memory_utilization"] == 0.45  # 0.9 of its half card
    assert "enforce_eager" not in cfg["engine_kwargs"] and cfg["accelerator_type"] == "H100"
    assert "VLLM_CPU_KVCACHE_SPACE" not in cfg["runtime_env"]["env_vars"]


def test_ray_serve_llm_accepts_the_configs_as_they_are():
    llm = pytest.importorskip("ray.serve.llm")
    cpu = llm.LLMConfig(
        **fleet.llm_config(fleet.PLMEntry(name="a", model="a", replicas=2), "/m/a", on_gpu=False)
    )
    assert cpu.model_id == "a" and cpu.accelerator_config.kind == "cpu"
    gpu = fleet.PLMEntry(name="b", model="b", tensor_parallel_size=2, accelerator_type="H100")
    assert llm.LLMConfig(**fleet.llm_config(gpu, "org/b", on_gpu=True)).accelerator_config.kind == "gpu"


def test_model_sources_a_preset_s_hub_id_a_directory_or_the_name_as_given(tmp_path):
    assert fleet.model_source("llama2") == "meta-llama/Llama-2-7b-chat-hf"  # each node loads it itself
    assert fleet.model_source(str(tmp_path)) == str(tmp_path.resolve())
    assert fleet.model_source("org/model") == "org/model" and fleet.model_source("s3://b/m") == "s3://b/m"
    with pytest.raises(fleet.FleetError, match="encoder-decoder"):
        fleet.model_source("flant5")


def test_the_plms_value_names_every_plm_at_the_one_serve_route_and_parses_back(tmp_path):
    f = fleet.read_fleet(write_fleet(tmp_path, """
        [ray]
        host = "0.0.0.0"
        public_host = "head"
        port = 8100
        [[plm]]
        name = "a"
        [[plm]]
        name = "b"
    """))  # fmt: skip
    value = fleet.plms_value(f)
    assert value == "a@http://head:8100/v1,b@http://head:8100/v1"
    assert [parse_plm(s) for s in value.split(",")] == [
        ("a", ["http://head:8100/v1"]),
        ("b", ["http://head:8100/v1"]),
    ]
    second = fleet.read_fleet(write_fleet(tmp_path, '[ray]\nroute = "/b/"\n[[plm]]\nname = "c"\n'))
    assert fleet.plms_value(second) == "c@http://127.0.0.1:8000/b/v1"  # a second fleet, its own route


def test_fleet_up_refuses_an_address_nothing_listens_at_quickly_and_plainly(tmp_path):
    pytest.importorskip("ray.serve")
    runner = CliRunner()

    def up(address: str) -> Result:
        return runner.invoke(
            app, ["fleet", "up", str(EXAMPLE), "--dir", str(tmp_path), "--ray-address", address]
        )

    # ray.init alone would retry for minutes; the address is checked before the packaged models
    # are prepared (a minute on first use), so the refusal is quick even in a fresh clone.
    started = time.monotonic()
    result = up(f"127.0.0.1:{free_port()}")
    assert result.exit_code == 1 and "no Ray cluster answers at" in said(result)
    assert time.monotonic() - started < 30
    for bad, message in (("not-an-address", "is not host:port"), ("local", "ray start --head")):
        result = up(bad)
        assert result.exit_code == 1 and message in said(result), result.output
    assert not (tmp_path / "fleet.json").exists()


def test_cli_fleet_commands_report_plainly(tmp_path):
    runner = CliRunner()
    bad = write_fleet(tmp_path, "[[plm]]\nname='a'\nport=1\n")
    result = runner.invoke(app, ["fleet", "up", str(bad), "--dir", str(tmp_path / "s")])
    assert result.exit_code == 1 and "unknown key" in result.output
    result = runner.invoke(app, ["fleet", "status", "--dir", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout) == []
    result = runner.invoke(app, ["fleet", "down", "--dir", str(tmp_path / "s")])
    assert result.exit_code == 0 and "no fleet recorded" in result.output
    old = tmp_path / "old"
    old.mkdir()
    (old / "fleet.json").write_text(json.dumps({"version": 1, "servers": []}))
    result = runner.invoke(app, ["fleet", "down", "--dir", str(old)])
    assert result.exit_code == 1 and "old process fleet" in said(result)


def test_the_recorded_state_holds_the_address_application_and_run_file(tmp_path):
    ray_fleet.write_state(
        tmp_path, {"address": "h:6379", "app": "wasp", "plms": "a@http://h:8000/v1"}, {"n": 24}
    )
    assert ray_fleet.read_state(tmp_path) == {"version": 2, "address": "h:6379", "app": "wasp",
                                              "plms": "a@http://h:8000/v1"}  # fmt: skip
    assert (tmp_path / "plms.txt").read_text().strip() == "a@http://h:8000/v1"
    assert (
        "n: 24" in (tmp_path / "run.yaml").read_text()
        and "- a@http://h:8000/v1" in (tmp_path / "run.yaml").read_text()
    )


def test_the_launch_scripts_call_the_fleet_commands(tmp_path):
    root = EXAMPLE.parent.parent
    out = subprocess.run(["bash", str(root / "launch" / "stop_fleet.sh"), "--dir", str(tmp_path)],
                         cwd=root, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "no fleet recorded" in out.stdout + out.stderr
