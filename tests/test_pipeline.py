"""The round loop's logic: quotas, cleaning, checkpoints, resume, failing engines, privacy boundary.

The subject here is the pipeline, not an LLM, so generation comes from
``FakeEngineForUnitTests`` (named as such); the embedder, FAISS search, voting and
Parquet I/O are the real ones. Real engines run in ``test_engines_real.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fakes import WORDS, DiesInRoundForTests, FakeEngineForUnitTests, KilledForTests
from wasp_vllm.cli.app import _print_summary, console
from wasp_vllm.config import ConfigError, RunConfig
from wasp_vllm.engines.base import Completion, GenerationParams
from wasp_vllm.pipeline import PipelineError, Run, prepare
from wasp_vllm.pipeline.manifest import Manifest, published_source
from wasp_vllm.pipeline.store import CheckpointError
from wasp_vllm.strategies import AUTO_LATER_PROMPT

CANARY = "CANARY-7f3a9e-private"


@pytest.fixture()
def private_csv(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = ["text,label"]
    for i in range(30):
        label = ["positive", "neutral", "negative"][i % 3]
        words = " ".join(rng.choice(WORDS, size=10))
        rows.append(f"{CANARY} record {i} {words},{label}")
    path = tmp_path / "private.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def make_cfg(private_csv: Path, **kw) -> RunConfig:
    base = dict(
        plms=["a", "b"],
        task="drugs",
        private=str(private_csv),
        private_limit=None,
        n=36,
        rounds=3,
        q=2,
        s=2,
        noise_seed=123,
        epsilon=4.0,
        delta=1e-5,
        # The loop's bookkeeping is the subject; the real embedder would judge the fakes' random
        # words for their sentiment (the label check has its own tests in test_levers.py).
        label_check="off",
    )
    return RunConfig(**(base | kw))


def run(cfg, out, embedder, engines=None, **kw):
    engines = engines if engines is not None else {}

    def factory(name: str, _cfg: RunConfig):
        return engines.setdefault(name, FakeEngineForUnitTests(name))

    return Run(prepare(cfg), out, engine_factory=factory, embedder=embedder).execute(**kw).to_json()


def test_run_writes_parquet_and_manifest(tmp_path, private_csv, embedder):
    manifest = run(make_cfg(private_csv), tmp_path / "out", embedder)
    table = pq.read_table(tmp_path / "out" / "synthetic.parquet")
    assert table.num_rows == 36
    assert set(table.column("label").to_pylist()) == {"positive", "neutral", "negative"}
    assert len(set(table.column("text").to_pylist())) == 36  # no copies
    kinds = dict(zip(table.column("round").to_pylist(), table.column("prompt_kind").to_pylist(), strict=True))
    assert kinds[0] == "zero_shot" and kinds[2] == AUTO_LATER_PROMPT.value
    privacy = manifest["privacy"]
    assert privacy["plan"]["sigma"] > 0 and privacy["plan"]["sensitivity"] > 0
    assert privacy["ledger"]["epsilon_spent_exact"] <= 4.0 + 1e-9
    assert privacy["ledger"]["compositions"] == 2  # two voting rounds (the labels split evenly)
    assert {r["round"] for r in manifest["rounds"]} == {0, 1, 2}
    assert all(sum(r["quotas"].values()) == 12 for r in manifest["rounds"])
    assert abs(sum(manifest["plms"]["final_weights"]) - 1) < 1e-9
    # published: the requested M and the source (the owner's keyed name of the file, not its path),
    # never a count or a hash of the records
    assert manifest["private_data"] == {"requested_m": None, "source": published_source(str(private_csv))}


def test_sampling_settings_reach_the_engine(tmp_path, private_csv, embedder):
    engines: dict = {}
    run(make_cfg(private_csv, top_k=7, temperature=0.7), tmp_path / "out", embedder, engines)
    sent = {(p.top_k, p.temperature, p.top_p) for e in engines.values() for p in e.params}
    assert sent == {(7, 0.7, 1.0)}


def test_resume_continues_killed_run(tmp_path, private_csv, embedder):
    cfg = make_cfg(private_csv)
    full = run(cfg, tmp_path / "full", embedder)

    killed = tmp_path / "killed"
    engines = {"a": DiesInRoundForTests(killed, 2, "a"), "b": FakeEngineForUnitTests("b")}
    with pytest.raises(KilledForTests):
        run(cfg, tmp_path / "killed", embedder, engines=engines)
    assert not (tmp_path / "killed" / "manifest.json").exists()
    resumed = run(cfg, tmp_path / "killed", embedder, resume=True)
    a = pq.read_table(tmp_path / "full" / "synthetic.parquet")
    b = pq.read_table(tmp_path / "killed" / "synthetic.parquet")
    assert a.equals(b)
    assert resumed["output"]["sha256"] == full["output"]["sha256"]  # byte-identical Parquet


def test_resume_after_the_last_round_loads_no_model(tmp_path, private_csv, embedder):
    cfg, out = make_cfg(private_csv), tmp_path / "out"
    full = run(cfg, out, embedder)
    (out / "synthetic.parquet").unlink()  # as if killed while writing the final file
    (out / "manifest.json").unlink()

    def no_engine(name: str, _cfg: RunConfig):
        raise AssertionError(f"engine {name} opened although every round is done")

    resumed = Run(prepare(cfg), out, engine_factory=no_engine, embedder=embedder).execute(resume=True)
    assert resumed.output.sha256 == full["output"]["sha256"]


def test_refuses_existing_run_and_detects_corruption(tmp_path, private_csv, embedder):
    cfg = make_cfg(private_csv)
    out = tmp_path / "out"
    run(cfg, out, embedder)
    with pytest.raises(CheckpointError, match="already holds a run"):
        run(cfg, out, embedder)
    round_file = out / "private" / "rounds" / "round-000.parquet"
    round_file.write_bytes(round_file.read_bytes()[:-10] + b"corrupted!")
    with pytest.raises(CheckpointError, match="corrupted"):
        run(cfg, out, embedder, resume=True)
    run(cfg, out, embedder, overwrite=True)
    assert pq.read_table(out / "synthetic.parquet").num_rows == 36


def test_resume_refuses_other_settings(tmp_path, private_csv, embedder):
    out = tmp_path / "out"
    run(make_cfg(private_csv), out, embedder)
    with pytest.raises(ConfigError, match="different settings"):
        run(make_cfg(private_csv, epsilon=2.0), out, embedder, resume=True)


def test_failing_engine_is_dropped_and_recorded(tmp_path, private_csv, embedder):
    engines = {"a": FakeEngineForUnitTests("a"), "b": FakeEngineForUnitTests("b", mode="raise")}
    manifest = run(
        make_cfg(private_csv, engine_args={"engine_retries": 1}), tmp_path / "out", embedder, engines=engines
    )
    assert manifest["plms"]["active"] == ["a"]
    assert "b" in manifest["plms"]["dropped"]
    assert engines["b"].calls == 2  # one try plus one retry, then dropped
    assert manifest["plms"]["final_weights"][1] == 0.0
    table = pq.read_table(tmp_path / "out" / "synthetic.parquet")
    assert set(table.column("plm").to_pylist()) == {"a"}
    assert table.num_rows == 36  # "a" takes over "b"'s share, in the round of the failure too


def test_all_engines_failing_stops_with_clear_error(tmp_path, private_csv, embedder):
    engines = {n: FakeEngineForUnitTests(n, mode="raise") for n in ("a", "b")}
    with pytest.raises(PipelineError, match="every PLM failed"):
        run(
            make_cfg(private_csv, engine_args={"engine_retries": 0}),
            tmp_path / "out",
            embedder,
            engines=engines,
        )


@pytest.mark.parametrize("mode", ["empty", "echo"])
def test_bad_outputs_are_regenerated_and_made_up_by_the_other_plm(tmp_path, private_csv, embedder, mode):
    engines = {"a": FakeEngineForUnitTests("a"), "b": FakeEngineForUnitTests("b", mode=mode)}
    manifest = run(
        make_cfg(private_csv, engine_args={"max_attempts": 2}), tmp_path / "out", embedder, engines=engines
    )
    table = pq.read_table(tmp_path / "out" / "synthetic.parquet")
    texts = table.column("text").to_pylist()
    assert len(texts) == len(set(texts)) == 36  # exactly N: a wrote what b could not, never a copy
    assert set(table.column("plm").to_pylist()) == {"a"}
    first = manifest["rounds"][0]
    assert engines["b"].calls == 2  # round 0: the first try and one regeneration ...
    assert first["shortfall"]["b"] == first["quotas"]["b"] == 6 and first["kept"]["a"] == 12
    assert all(r["missing"] == 0 for r in manifest["rounds"])
    assert manifest["rounds"][-1]["quotas"]["b"] == 0  # ... then its samples got no votes: weight 0


def test_private_text_never_leaves(tmp_path, private_csv, embedder, caplog):
    caplog.set_level(logging.DEBUG)
    engines: dict = {}
    out = tmp_path / "out"
    run(make_cfg(private_csv), out, embedder, engines=engines)
    prompts = [p for e in engines.values() for p in e.prompts]
    assert prompts and not any(CANARY in p for p in prompts)
    assert CANARY not in caplog.text
    for path in out.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path


def test_settings_that_cannot_work_are_refused(private_csv):
    with pytest.raises(ConfigError, match="too small"):
        prepare(make_cfg(private_csv, n=5))
    with pytest.raises(ConfigError, match="draws fewer records than q"):  # decided on the public --m
        prepare(make_cfg(private_csv, q=31, n=300, private_limit=30))
    with pytest.raises(ConfigError, match="s=50"):
        prepare(make_cfg(private_csv, s=50))


def test_the_same_text_from_two_plms_is_kept_once(tmp_path, private_csv, embedder):
    class ConstantEngineForUnitTests(FakeEngineForUnitTests):
        """Both PLMs answer the same texts (seeded by slot only), as two similar models might."""

        def generate(self, prompts, seeds, params):
            return [Completion(f"same review number {i % 4} for everyone", 5) for i in range(len(prompts))]

    engines = {n: ConstantEngineForUnitTests(n) for n in ("a", "b")}
    manifest = run(
        make_cfg(private_csv, engine_args={"max_attempts": 1}), tmp_path / "out", embedder, engines=engines
    )
    texts = pq.read_table(tmp_path / "out" / "synthetic.parquet").column("text").to_pylist()
    assert len(texts) == len(set(texts)) == 4
    # no PLM could write anything new: each round asks for what the earlier ones lacked, the last
    # round's record says what the run lacks of N
    assert [r["missing"] for r in manifest["rounds"]] == [12 - 4, 24 - 4, 36 - 4]
    assert sum(r["quotas"]["a"] + r["quotas"]["b"] for r in manifest["rounds"][1:]) == 24 - 4 + 36 - 4


def test_a_round_s_shortfall_is_made_up_by_the_next_round(tmp_path, private_csv, embedder):
    """Round 0 can write only 8 of its 12 samples (rejects use up every retry); round 1 asks for
    the 4 it lacked beside its own 12, and the run ends with exactly N rows."""

    good_left = [8]  # usable answers round 0 gets, shared by the PLMs; junk after that

    class ShortFirstRoundForUnitTests(FakeEngineForUnitTests):
        """Answers junk (rejected) once round 0 had its 8 usable samples."""

        def generate(self, prompts, seeds, params):
            out = super().generate(prompts, seeds, params)
            if not self.round_zero:
                return out
            kept = []
            for completion in out:
                kept.append(completion if good_left[0] > 0 else Completion("", 0))
                good_left[0] -= 1
            return kept

    engines = {n: ShortFirstRoundForUnitTests(n) for n in ("a", "b")}
    for engine in engines.values():
        engine.round_zero = True
    real_round = Run._round

    def round_then_heal(self, t, state):
        real_round(self, t, state)
        for engine in engines.values():
            engine.round_zero = False

    import wasp_vllm.pipeline.loop as loop

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(loop.Run, "_round", round_then_heal)
    try:
        manifest = run(
            make_cfg(private_csv, label_prior="uniform"), tmp_path / "out", embedder, engines=engines
        )
    finally:
        monkeypatch.undo()
    rounds = manifest["rounds"]
    assert rounds[0]["missing"] == 4 and sum(rounds[1]["quotas"].values()) == 12 + 4
    assert rounds[-1]["missing"] == 0
    assert pq.read_table(tmp_path / "out" / "synthetic.parquet").num_rows == 36
    # the summary after the run: the gap was made up, so the run is not short
    with console.capture() as printed:
        _print_summary(Manifest.from_json(manifest), tmp_path / "out")
    assert "36 samples written" in printed.get() and "short by" not in printed.get()


def test_rows_carry_the_run_s_plm_name_whatever_the_engine_calls_itself(tmp_path, private_csv, embedder):
    """A served PLM (name@http://...) may report another name; votes must still find its rows."""

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return FakeEngineForUnitTests(f"served-{name}")

    cfg = make_cfg(private_csv)
    manifest = Run(prepare(cfg), tmp_path / "out", engine_factory=factory, embedder=embedder).execute()
    plms = set(pq.read_table(tmp_path / "out" / "synthetic.parquet").column("plm").to_pylist())
    assert plms == {"a", "b"}
    assert len(manifest.plms.final_weights) == 2


@pytest.mark.parametrize(("example_sets", "most_distinct"), [(2, 2), (0, 20)])
def test_wasp_prompts_share_a_few_example_draws(private_csv, example_sets, most_distinct):
    from wasp_vllm.pipeline.prompts import RoundInputs, Share, make_slots
    from wasp_vllm.pipeline.state import Pools
    from wasp_vllm.strategies import STRATEGIES

    cfg = make_cfg(private_csv, s=4, example_sets=example_sets)
    pool = [f"review number {i} " + " ".join(WORDS[i : i + 5]) for i in range(12)]
    pools = Pools(good={"positive": pool[:6]}, bad={"positive": pool[6:]})
    ctx = prepare(cfg)
    rin = RoundInputs(
        cfg, STRATEGIES["wasp"], ctx.task, pools, t=1, seen=frozenset(), params=GenerationParams()
    )
    slots = make_slots(rin, Share(k=0, quota=20), ["positive"] * 20, attempt=0)
    draws = {slot.examples for slot in slots}
    assert all(slot.kind == "contrastive" for slot in slots)
    # with sharing: exactly ``example_sets`` draws; without: (almost surely) one per prompt
    assert len(draws) == most_distinct if example_sets else len(draws) >= most_distinct - 2
    # a shared draw is a shared prompt prefix (what vLLM's prefix cache reuses)
    by_draw = {}
    for slot in slots:
        by_draw.setdefault(slot.examples, []).append(slot.prompt)
    for prompts in by_draw.values():
        head = min(len(p) for p in prompts) // 2
        assert len({p[:head] for p in prompts}) == 1
