"""The throughput cache (issue 57, item 1): nothing derived from a run that touched private data
reaches a later run's published bytes.

An earlier run on ``D``, or on ``D`` minus one record, leaves its measurements in
``$WASP_VLLM_CACHE/throughput.json``; a later plan (``generate --dry-run``) and a later run (its
manifest's ``estimate`` and its "estimated ... of work" line) read them and publish them.  They
must be the same bytes after either earlier run.  The cache may hold facts of the machine and the
engine (start-up, tokens per second), never the earlier run's rejects per kept sample or its
sample lengths, which follow its noisy votes.

The engine is a FAKE for unit tests that runs on a clock of its own: seven seconds to start, and a
speed that depends on the prompts it is given (as a real engine's does: longer prompts, more
prefill), so that round 0's public prompts give both worlds the same speed while any prompt a
private release steered (later rounds' examples, a private label mix) would show in the cache
(wall-clock jitter would hide nothing and prove nothing).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

import wasp_vllm
import wasp_vllm.config.checks as checks
import wasp_vllm.pipeline.backends as run_backends
import wasp_vllm.pipeline.estimate as estimate
import wasp_vllm.pipeline.generation as generation
import wasp_vllm.pipeline.loop as loop
from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests, use_fake_backends
from tests.test_neighbouring import rows
from wasp_vllm.cli import app
from wasp_vllm.ops.audit import CanaryDesign, audit
from wasp_vllm.pipeline import Backends, throughput

STARTUP_S = 7.0
SETTINGS = ["--plms", "a,b", "--n", "36", "--rounds", "3", "--q", "2", "--s", "2", "--engine", "hf",
            "--max-new-tokens", "40", "--label-check", "drop"]  # fmt: skip


class FakeClock:
    """A perf_counter that moves only when the fake engine works."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def seconds_per_token(prompt: str) -> float:
    """The fake machine's cost of one token after ``prompt``: between 1 and 2 s, set by the prompt's
    bytes (any change of the prompts changes the speed)."""
    return 1.0 + hashlib.blake2b(prompt.encode(), digest_size=2).digest()[0] / 255.0


class ClockedFakeEngineForUnitTests(FakeEngineForUnitTests):
    """FAKE engine for unit tests: writes on the ``clock``, at a speed its prompts set; starts in 7 s."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, keep_prompts=False)
        self.clock = clock
        clock.now += STARTUP_S

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        self.clock.now += sum(c.n_tokens * seconds_per_token(p) for c, p in zip(out, prompts, strict=True))
        return out


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A CPU machine whose only clock is the fake engine's; its engine counts as transformers."""
    use_fake_backends(monkeypatch)
    clock = FakeClock()
    fake_time = SimpleNamespace(perf_counter=clock, sleep=lambda s: None, monotonic=clock)
    monkeypatch.setattr(generation, "time", fake_time)
    monkeypatch.setattr(loop, "time", fake_time)
    monkeypatch.setattr(run_backends, "time", fake_time)  # the engines' start-up is timed there
    monkeypatch.setattr(estimate, "nvidia_gpus", lambda: [])
    monkeypatch.setattr(checks.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine: no busy note
    monkeypatch.setitem(estimate.ENGINE_KINDS, ClockedFakeEngineForUnitTests.__name__, "hf")

    def factory(name: str, _cfg: Any) -> ClockedFakeEngineForUnitTests:
        return ClockedFakeEngineForUnitTests(name, clock)

    backends = Backends(factory, HashEmbedderForTests())
    monkeypatch.setattr("wasp_vllm.pipeline.default_backends", lambda cfg: backends)
    return clock


def _write(path: Path, records: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in records))
    return path


def _cli(*argv: str):
    result = CliRunner().invoke(app, list(argv), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


def _world(tmp_path: Path, monkeypatch, clock: FakeClock, earlier: list[dict[str, str]], name: str,
           *earlier_settings: str) -> dict:  # fmt: skip
    """An earlier run on ``earlier`` with a real secret key, then a later plan and run: what they publish."""
    folder = tmp_path / name
    monkeypatch.setenv("WASP_VLLM_CACHE", str(folder / "cache"))
    clock.now = 0.0
    _cli("generate", *SETTINGS, *earlier_settings, "--private", str(_write(folder / "earlier.csv", earlier)),
         "--out", str(folder / "earlier"))  # fmt: skip
    path = throughput.records_path()
    cached = json.loads(path.read_text()) if path.exists() else {}
    later_private = _write(folder / "later.csv", rows(18))  # the same file in both worlds
    plan = _cli("generate", *SETTINGS, "--private", str(later_private), "--dry-run")
    later = _cli("generate", *SETTINGS, "--private", str(later_private), "--noise-seed", "3", "--out",
                 str(folder / "later"))  # fmt: skip
    manifest = json.loads((folder / "later" / "manifest.json").read_text())
    return {
        "cache": cached,
        "dry run": plan.output,
        "manifest estimate (plan)": json.dumps(manifest["estimate"]["plan"], sort_keys=True),
        "estimated line": [x for x in later.output.splitlines() if "of work" in x],
    }


def test_an_earlier_run_on_neighbouring_files_leaves_the_same_later_bytes(tmp_path, monkeypatch, machine):
    records = rows()
    d = _world(tmp_path, monkeypatch, machine, records, "d")
    d_prime = _world(tmp_path, monkeypatch, machine, records[:1] + records[2:], "d-prime")
    for name in d:
        assert d[name] == d_prime[name], f"{name} depends on the earlier run's private file"
    # the cache was read (else the test proves nothing) and holds facts of the machine alone
    assert "last run here" in d["dry run"] and d["estimated line"]
    assert set(d["cache"]) == {"a|hf|cpu", "b|hf|cpu"}
    for measured in d["cache"].values():
        assert set(measured) == {"tokens_per_s", "startup_s", "when"}
        assert 0.5 < measured["tokens_per_s"] < 1.0 and measured["startup_s"] == STARTUP_S
    # the per-sample facts are the public ones: the token cap and the built-in reject rate
    for engine in json.loads(d["manifest estimate (plan)"])["engines"]:
        assert engine["tokens"] == engine["generated"] * 40
        assert engine["generated"] == round(engine["samples"] * throughput.REGENERATION["label_check"])


def test_a_run_whose_round_0_a_private_release_steered_records_nothing(tmp_path, monkeypatch, machine):
    """With ``--label-prior private`` round 0's label mix follows the noisy histogram of the
    private labels: its speed is not a fact of the machine alone, and stays out of the cache."""
    records = rows()
    d = _world(tmp_path, monkeypatch, machine, records, "d", "--label-prior", "private")
    d_prime = _world(tmp_path, monkeypatch, machine, records[:1] + records[2:], "d-prime", "--label-prior",
                     "private")  # fmt: skip
    assert d["cache"] == d_prime["cache"] == {}
    assert "last run here" not in d["dry run"] and d == d_prime


def test_void_epsilon_and_audit_runs_record_nothing(tmp_path, monkeypatch, machine):
    monkeypatch.setenv("WASP_VLLM_CACHE", str(tmp_path / "cache"))
    private = _write(tmp_path / "p.csv", rows())
    _cli("generate", *SETTINGS, "--private", str(private), "--noise-seed", "1", "--out", str(tmp_path / "v"))
    assert not throughput.records_path().exists()
    audit(str(private), out=tmp_path / "audit", design=CanaryDesign(canaries=8), allow_weak=True, plms=["a"],
          n=24, rounds=2, q=2, s=2, engine="hf", epsilon=4.0)  # fmt: skip
    assert not throughput.records_path().exists()
    wasp_vllm.generate(str(private), out=tmp_path / "real", plms=["a"], n=24, rounds=2, q=2, s=2, engine="hf")
    assert throughput.records_path().exists()  # a real run does record: the checks above are not vacuous
