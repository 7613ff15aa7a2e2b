"""No published figure moves with the time private work takes (issue 57, item 7a).

The time spent on private records (their embedding, the vote) scales with the private data, so it
stays in the operator's state.  Here the private embedding is slowed on purpose - a FAKE embedder
for unit tests that takes 1 s per synthetic sample and, on private records only, 1 s or 1000 s - on
a fake clock that only the fakes move; every published byte (synthetic.parquet, manifest.json with
its timings and estimate, the card, the default-level output) must be the same in both runs.  The
planted bug this catches: the private embedding's time booked as the embedder's public start-up.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from typer.testing import CliRunner

import wasp_vllm.pipeline.generation as generation
import wasp_vllm.pipeline.loop as loop
from tests.fakes import HashEmbedderForTests, use_fake_backends
from tests.test_reliability import write_private
from tests.test_throughput_cache import SETTINGS, ClockedFakeEngineForUnitTests, FakeClock
from wasp_vllm.cli import app
from wasp_vllm.pipeline import Backends
from wasp_vllm.pipeline.store import PUBLISHED


class SlowPrivateEmbedderForTests(HashEmbedderForTests):
    """FAKE embedder for unit tests: 1 s of ``clock`` per text, ``private_s`` per private record."""

    def __init__(self, clock: FakeClock, private: set[str], private_s: float) -> None:
        super().__init__()
        self.clock, self.private, self.private_s = clock, private, private_s

    def load(self) -> None:
        self.clock.now += 5.0  # the public start-up

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.clock.now += sum(self.private_s if t in self.private else 1.0 for t in texts)
        return super().encode(texts)


def _published(tmp_path: Path, monkeypatch, private_s: float) -> dict[str, bytes]:
    folder = tmp_path / "world"  # one path for both runs: the manifest names the file by its path
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("WASP_VLLM_CACHE", str(folder / "cache"))
    private = write_private(folder / "private.csv", n=18)
    texts = {line.rsplit(",", 1)[0] for line in private.read_text().splitlines()[1:]}
    clock = FakeClock()
    fake_time = SimpleNamespace(perf_counter=clock, sleep=lambda s: None)
    monkeypatch.setattr(generation, "time", fake_time)
    monkeypatch.setattr(loop, "time", fake_time)
    embedder = SlowPrivateEmbedderForTests(clock, texts, private_s)
    backends = Backends(lambda name, cfg: ClockedFakeEngineForUnitTests(name, clock), embedder)
    monkeypatch.setattr("wasp_vllm.pipeline.default_backends", lambda cfg: backends)
    argv = ["generate", *SETTINGS, "--private", "private.csv", "--noise-seed", "4", "--out", "out"]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert clock.now > 18 * private_s  # the private step did take its time
    published = {name: (folder / "out" / name).read_bytes() for name in PUBLISHED}
    return published | {"default-level output": result.output.encode()}


def test_a_slower_private_embedding_moves_no_published_figure(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    monkeypatch.setattr("wasp_vllm.pipeline.estimate.nvidia_gpus", lambda: [])
    fast = _published(tmp_path, monkeypatch, 1.0)
    slow = _published(tmp_path, monkeypatch, 1000.0)
    for name in fast:
        assert fast[name] == slow[name], f"{name} moves with the time of the private embedding"
    assert b'"startup:embedder": 5.0' in fast["manifest.json"]  # public timings are there, and exact
