"""Test doubles for pipeline-logic tests, named as such; never used where a test claims to exercise an engine.

* ``FakeEngineForUnitTests``: deterministic pseudo-text per (prompt, seed) that names the label the
  prompt asks for (so it passes the label check); modes simulate misbehaving engines (empty
  output, echoes, raising always, after some calls, or on given calls).
* ``HashEmbedderForTests``: a deterministic 64-dim bag-of-words embedder (each word a fixed random
  vector seeded by its hash). Used where the subject is the round loop, I/O or memory, not embeddings.

Run as a script (``python -m tests.fakes CONFIG.json OUT [--resume]``) it executes a real
``Run(prepare(cfg), out, ...)`` with these doubles. ``WASP_TEST_KILL_AT=<stage>:<n>`` makes the
process SIGKILL itself at the n-th (1-based) occurrence of a stage:

* ``generate``: inside the n-th call of any engine's ``generate``
* ``vote``: inside the n-th voting round (before the noisy histograms exist)
* ``write_round``: half-way through writing the n-th round's Parquet file (a partial temp file)
* ``write_votes``: half-way through writing the n-th voting round's noisy votes
* ``save_state``: after the n-th round file is in place, before its state is saved
* ``write_final``: half-way through writing the final synthetic.parquet

``WASP_TEST_REPORT=path`` writes the process's wall time and peak RSS (ru_maxrss) there as JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wasp_vllm.engines.base import Completion, GenerationParams
from wasp_vllm.tasks import get_task, list_tasks

WORDS = [
    "great",
    "awful",
    "fine",
    "relief",
    "nausea",
    "sleep",
    "pain",
    "better",
    "worse",
    "doctor",
    "dose",
    "week",
    "side",
    "effect",
    "works",
]


def _label_phrases() -> dict[str, str]:
    """Every built-in task's label phrase in its prompts -> itself, what the label check compares
    samples with."""
    phrases: dict[str, str] = {}
    for name in list_tasks():
        task = get_task(name)
        for label in task.labels:
            phrases[task.label_text(label)] = task.label_text(label)
    return phrases


LABEL_PHRASES = _label_phrases()


def asked_label_phrase(prompt: str) -> str | None:
    """The label phrase a prompt asks for: the one named last (the instruction ends the prompt).

    Right for every built-in task but the two ``*_category`` ones, whose prompts name the
    attribute (a star rating, also a label phrase of ``*_rating``) after the label."""
    return _last_label_phrase(prompt[-240:])  # the instruction's last words; cached per tail


@functools.lru_cache(maxsize=4096)
def _last_label_phrase(tail: str) -> str | None:
    # The phrase ending last, the longest of those ("very positive ..." over "positive ...").
    found = max(LABEL_PHRASES, key=lambda p: (tail.rfind(p) + len(p) if p in tail else -1, len(p)))
    return LABEL_PHRASES[found] if found in tail else None


class FakeEngineForUnitTests:
    """Deterministic pseudo-text per (prompt, seed); modes simulate misbehaving engines.

    ``fail_after``: raise on every call after that many; ``fail_calls``: raise on exactly these
    (1-based) call numbers, e.g. ``{2}`` for a transient failure; ``keep_prompts=False`` saves memory.
    """

    def __init__(
        self,
        name: str,
        mode: str = "ok",
        fail_after: int | None = None,
        fail_calls: Sequence[int] = (),
        keep_prompts: bool = True,
    ) -> None:
        self.name = name
        self.mode = mode
        self.fail_after = fail_after
        self.fail_calls = set(fail_calls)
        self.keep_prompts = keep_prompts
        self.calls = 0
        self.prompts: list[str] = []
        self.params: list[GenerationParams] = []

    def generate(self, prompts, seeds, params: GenerationParams) -> list[Completion]:
        self.calls += 1
        self.params.append(params)
        _maybe_kill("generate")
        if self.keep_prompts:
            self.prompts.extend(prompts)
        failing = self.fail_after is not None and self.calls > self.fail_after
        if self.mode == "raise" or failing or self.calls in self.fail_calls:
            raise MemoryError("simulated out of memory")
        out = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            if self.mode == "empty":
                out.append(Completion("   ", 1))
            elif self.mode == "echo":
                out.append(Completion(prompt[-60:], 10))
            else:
                h = int(hashlib.sha256(f"{prompt}|{seed}".encode()).hexdigest()[:12], 16)
                rng = np.random.default_rng(h)
                # A PLM that writes the sentiment it is asked for: it names the label twice.
                phrase = asked_label_phrase(prompt)
                label_words = f" {phrase} {phrase}" if phrase else ""
                out.append(Completion(" ".join(rng.choice(WORDS, size=12)) + label_words + '" and more', 12))
        return out

    def close(self) -> None:
        pass


class RewritingFakeEngineForUnitTests(FakeEngineForUnitTests):
    """FAKE engine for unit tests: the base engine's samples, each passed through ``rewrite``;
    ``count`` is how many samples this engine has written so far, the current one included."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.count = 0

    def generate(self, prompts, seeds, params: GenerationParams) -> list[Completion]:
        out = []
        for completion in super().generate(prompts, seeds, params):
            self.count += 1
            out.append(self.rewrite(completion, params))
        return out

    def rewrite(self, completion: Completion, params: GenerationParams) -> Completion:
        return completion


class HashEmbedderForTests:
    """Deterministic 64-dim embeddings: the normalised sum of fixed random vectors of the words."""

    name = "hash-embedder-for-tests"

    def __init__(self, spec: str = "hash", device: str | None = None, dim: int = 64, **_: object) -> None:
        self.dim = dim
        self._vectors: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        vec = self._vectors.get(word)
        if vec is None:
            seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            vec = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            self._vectors[word] = vec
        return vec

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.casefold().split():
                out[i] += self._word(word)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)


def use_fake_backends(monkeypatch, engines: dict | None = None) -> dict:
    """Make the CLI and the API run on ``FakeEngineForUnitTests`` and ``HashEmbedderForTests``.

    Replaces the one seam they go through (``wasp_vllm.pipeline.default_backends``) and the
    resolution of PLM and embedder names (fake PLMs are called "a", "b", ...). Returns the engines
    by PLM name, filled as the run opens them.
    """
    from wasp_vllm.pipeline import Backends

    engines = engines if engines is not None else {}

    def factory(name: str, _cfg: object) -> FakeEngineForUnitTests:
        return engines.setdefault(name, FakeEngineForUnitTests(name))

    monkeypatch.setattr(
        "wasp_vllm.pipeline.default_backends", lambda cfg: Backends(factory, HashEmbedderForTests())
    )
    monkeypatch.setattr("wasp_vllm.engines.registry.check_plms", lambda specs, kind, **_: None)
    monkeypatch.setattr(
        "wasp_vllm.engines.embedder.resolve_embedder", lambda spec: ("hash-embedder-for-tests", None)
    )
    monkeypatch.setattr("wasp_vllm.pipeline.loop.gpu_available", lambda: False)  # spares importing torch
    return engines


# --- self-inflicted SIGKILL at a chosen point ------------------------------------------------------

_counts: dict[str, int] = {}


def _due(stage: str) -> bool:
    """Count one occurrence of ``stage``; True at the n-th when WASP_TEST_KILL_AT=stage:n."""
    want, _, n = os.environ.get("WASP_TEST_KILL_AT", "").partition(":")
    if want != stage:
        return False
    _counts[stage] = _counts.get(stage, 0) + 1
    return _counts[stage] == int(n or 1)


def _maybe_kill(stage: str) -> None:
    if _due(stage):
        os.kill(os.getpid(), signal.SIGKILL)


def _install_kill_points() -> None:
    import pyarrow.parquet as pq

    import wasp_vllm.pipeline.store as store
    import wasp_vllm.privacy.mechanisms as mechanisms

    # the patched classes, typed Any: mypy rejects assigning to a method, which is the point here
    voting: Any = mechanisms.VotingMechanism
    run_store: Any = store.RunStore
    real_vote = mechanisms.VotingMechanism.release

    def vote(self, *args, **kwargs):
        _maybe_kill("vote")
        return real_vote(self, *args, **kwargs)

    voting.release = vote

    real_write = pq.write_table

    def write_table(table, where, *args, **kwargs):
        name = Path(where).name  # a temp name: .round-001.parquet.XXXX or .synthetic.parquet.XXXX
        stages = {".round-": "write_round", ".votes-": "write_votes"}
        stage = next((v for k, v in stages.items() if name.startswith(k)), "write_final")
        if _due(stage):
            real_write(table, where, *args, **kwargs)
            data = Path(where).read_bytes()
            Path(where).write_bytes(data[: len(data) // 2])  # half a file on disk, then die
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(table, where, *args, **kwargs)

    store.pq.write_table = write_table

    real_save = store.RunStore.save_state

    def save_state(self, state):
        _maybe_kill("save_state")
        return real_save(self, state)

    run_store.save_state = save_state


def _own_peak_rss_kib() -> int:
    """This process's own peak RSS.

    Linux carries ru_maxrss across execve (it keeps the parent's high-water mark from
    the fork), so a child of a big pytest process would report the parent's size;
    VmHWM belongs to the process's own address space.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: Sequence[str]) -> int:
    from wasp_vllm.config import RunConfig
    from wasp_vllm.pipeline import Run, prepare

    start = time.perf_counter()
    config_path, out = argv[0], argv[1]
    resume = "--resume" in argv
    cfg = RunConfig(**json.loads(Path(config_path).read_text()))
    _install_kill_points()
    engines: dict[str, FakeEngineForUnitTests] = {}

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return engines.setdefault(name, FakeEngineForUnitTests(name, keep_prompts=False))

    Run(prepare(cfg), out, engine_factory=factory, embedder=HashEmbedderForTests()).execute(resume=resume)
    report = os.environ.get("WASP_TEST_REPORT")
    if report:
        peak_kib = _own_peak_rss_kib()
        wall = time.perf_counter() - start
        Path(report).write_text(json.dumps({"peak_rss_mib": peak_kib / 1024, "wall_s": wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


class KilledForTests(BaseException):
    """Stands for SIGKILL: nothing in the pipeline may catch it."""


class DiesInRoundForTests(FakeEngineForUnitTests):
    """Killed at its first call once the rounds before ``round_index`` are committed (a round may
    take several calls: a reject is asked again), whatever its prompts look like."""

    def __init__(self, out: Path, round_index: int, name: str) -> None:
        super().__init__(name)
        self.last_committed = out / "private" / "rounds" / f"round-{round_index - 1:03d}.parquet"

    def generate(self, prompts, seeds, params):
        if self.last_committed.exists():
            raise KilledForTests
        return super().generate(prompts, seeds, params)
