"""Issue 60, item 3: a run writes exactly N rows at every size unless an engine fails for good.

The last round cannot hand its missing samples to a later one, so after the usual passes it keeps
asking, within a cap that follows its own reject rate (``generation.AskingCap``).  The PLMs are
``FakeEngineForUnitTests`` variants (named as such): the subject is the round's bookkeeping, not an
LLM.  The embedder, voting and Parquet I/O are the real ones.
"""

from __future__ import annotations

import hashlib

import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests
from tests.test_pipeline import make_cfg, run
from tests.test_pipeline import private_csv as private_csv_fixture
from wasp_vllm.engines.base import Completion
from wasp_vllm.pipeline.generation import AskingCap, PLMResult


class MostlyJunkEngineForUnitTests(FakeEngineForUnitTests):
    """Writes junk (an empty sample, rejected) for about ``junk`` of its answers, by a hash of the
    prompt and seed: like the tiny real run of the issue, whose label check turned down 18 of 23."""

    def __init__(self, name: str, junk: float) -> None:
        super().__init__(name)
        self.junk = junk
        self.generated = 0

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        self.generated += len(out)
        return [
            c if self._usable(p, s) else Completion("", 1)
            for c, p, s in zip(out, prompts, seeds, strict=True)
        ]

    def _usable(self, prompt: str, seed: int) -> bool:
        h = int(hashlib.sha256(f"{prompt}|{seed}".encode()).hexdigest()[:8], 16)
        return h / 0xFFFFFFFF >= self.junk


private_csv = private_csv_fixture  # the same private file as the pipeline's tests


@pytest.mark.parametrize("junk", [0.75, 0.85])
def test_the_tiny_run_writes_exactly_n_rows_though_most_samples_are_rejected(
    tmp_path, private_csv, embedder, junk
):
    """The issue's size (N=12, T=2, S=2, one PLM) with most samples rejected: all 12 rows."""
    engines = {"a": MostlyJunkEngineForUnitTests("a", junk)}
    cfg = make_cfg(private_csv, plms=["a"], n=12, rounds=2, s=2, engine_args={"max_attempts": 1})
    manifest = run(cfg, tmp_path / "out", embedder, engines=engines)
    table = pq.read_table(tmp_path / "out" / "synthetic.parquet")
    assert table.num_rows == 12
    assert manifest["rounds"][-1]["missing"] == 0
    assert set(table.column("label").to_pylist()) == {"positive", "neutral", "negative"}


class SilentInRound0ForUnitTests(FakeEngineForUnitTests):
    """Its first call (round 0, one attempt) writes only junk: the run starts with nothing to vote on."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls_made = 0

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        self.calls_made += 1
        return [Completion("", 1) for _ in out] if self.calls_made == 1 else out


def test_a_round_that_keeps_no_sample_is_not_voted_on_and_the_next_makes_it_up(
    tmp_path, private_csv, embedder
):
    """Every sample of round 0 turned down: no vote (nothing to rank, nothing spent), and the
    later rounds write the rows it lacks."""
    engines = {"a": SilentInRound0ForUnitTests("a")}
    cfg = make_cfg(private_csv, plms=["a"], n=12, rounds=3, s=2, engine_args={"max_attempts": 1})
    manifest = run(cfg, tmp_path / "out", embedder, engines=engines)
    assert manifest["rounds"][0]["kept"] == {"a": 0}
    assert pq.read_table(tmp_path / "out" / "synthetic.parquet").num_rows == 12
    assert len(manifest["privacy"]["ledger"]["sigmas"]) == 1  # round 1's vote only


class DriesUpForUnitTests(FakeEngineForUnitTests):
    """In the last round, one usable sample and then junk for ever: asking must stop at the cap."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.last_round_calls = 0
        self.last_round_generated = 0

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        if not any(LATER_PROMPT in p for p in prompts):  # round 0: zero-shot prompts
            return out
        self.last_round_calls += 1
        self.last_round_generated += len(out)
        keep = 1 if self.last_round_calls == 1 else 0
        return out[:keep] + [Completion("", 1)] * (len(out) - keep)


#: Words of the drugs task's few-shot prompt (rounds after 0), absent from its zero-shot one.
LATER_PROMPT = "Based on the above drug reviews"


def test_the_last_round_stops_asking_at_its_cap(tmp_path, private_csv, embedder):
    engine = DriesUpForUnitTests("a")
    cfg = make_cfg(private_csv, plms=["a"], n=12, rounds=2, s=2, engine_args={"max_attempts": 1})
    manifest = run(cfg, tmp_path / "out", embedder, engines={"a": engine})
    last = manifest["rounds"][-1]
    assert last["missing"] > 0  # it ended short, as it must when a PLM writes nothing usable
    # The usual passes (1 PLM + max_attempts=1): 6 asked, then the 5 missing: 1 kept of 11. The
    # cap then allows 3 x 5 / (1/11) = 165 more; one pass may overshoot it by the 5 it asks.
    usual, cap = 6 + 5, AskingCap.after({"a": PLMResult(rows=[{}], generated=11)}, 5, 1).limit
    assert cap == usual + 165
    assert cap <= engine.last_round_generated <= cap + 5  # asked on up to the cap, and no further
    assert engine.last_round_calls > 2


def test_the_cap_follows_the_reject_rate():
    def results(generated: int, kept: int) -> dict[str, PLMResult]:
        return {"a": PLMResult(rows=[{}] * kept, generated=generated)}

    assert AskingCap.after(results(10, 5), 5, 1).limit == 10 + 30  # half kept: 3 x 5 / 0.5
    assert AskingCap.after(results(10, 1), 9, 1).limit == 10 + 270  # a tenth kept: 3 x 9 / 0.1
    assert AskingCap.after(results(1000, 1), 5, 1).limit == 1000 + 750  # floor at 2 % kept
    assert AskingCap(20).spent(results(20, 3)) and not AskingCap(21).spent(results(20, 3))
