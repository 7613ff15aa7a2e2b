"""The noise a run really adds, the secret it comes from, and what a resumed run really redoes.

The subject is the round loop around the voting step, so generation comes from
``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests`` (named as such); voting,
noise, the ledger and the store are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import private_texts
from wasp_vllm.config import RunConfig
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.pipeline.store import RunStore
from wasp_vllm.privacy.voting import clean_histograms

LABELS = ["positive", "neutral", "negative"]


def write_private(path: Path, n: int = 60) -> Path:
    lines = ["text,label"] + [f"{t},{LABELS[i % 3]}" for i, t in enumerate(private_texts(n, seed=3))]
    path.write_text("\n".join(lines) + "\n")
    return path


def config(private: Path, **kw) -> RunConfig:
    base = dict(plms=["a", "b"], task="drugs", private=str(private), private_limit=None, n=90, rounds=3,
                q=2, s=2, noise_seed=None, engine_args={"concurrent": False})  # fmt: skip
    return RunConfig(**(base | kw))


def run(cfg: RunConfig, out: Path, engines: dict | None = None, **kw) -> dict:
    engines = engines if engines is not None else {}

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return engines.setdefault(name, FakeEngineForUnitTests(name))

    # the published manifest.json's content
    return (
        Run(prepare(cfg), out, engine_factory=factory, embedder=HashEmbedderForTests())
        .execute(**kw)
        .to_json()
    )


def noise_residuals(cfg: RunConfig, out: Path) -> np.ndarray:
    """Released votes minus the clean votes recomputed here: the noise the run really added."""
    ctx, store, embedder = prepare(cfg), RunStore(out), HashEmbedderForTests()
    private_emb = embedder.encode(ctx.private.texts)
    residuals = []
    for t in range(cfg.rounds - 1):
        # a vote ranks the samples written so far
        synth = pa.concat_tables([store.read_round(r) for r in range(t + 1)])
        votes = pq.read_table(store.votes_path(t))
        assert votes.column("id").to_pylist() == synth.column("id").to_pylist()
        emb = np.asarray(synth.column("embedding").to_pylist(), dtype=np.float32)
        labels = np.array([LABELS.index(x) for x in synth.column("label").to_pylist()])
        near, far = clean_histograms(private_emb, ctx.private.labels, emb, labels, cfg.q)
        # H_far is released (and paid for) only where the prompts show the far pool
        released = ["h_near", "h_far"] if cfg.far_votes == "on" else ["h_near"]
        assert votes.column_names == ["id", *released]
        clean = {"h_near": near, "h_far": far}
        residuals += [votes.column(h).to_numpy() - clean[h] for h in released]
    return np.concatenate(residuals)


@pytest.mark.parametrize(("federated", "far_votes"), [(False, "auto"), (True, "auto"), (False, "on")])
def test_the_noise_added_is_the_sigma_the_manifest_reports(tmp_path, federated, far_votes):
    cfg = config(write_private(tmp_path / "p.csv"), parties=3 if federated else None, far_votes=far_votes)
    manifest = run(cfg, tmp_path / "out")
    sigma = manifest["privacy"]["plan"]["sigma"]
    assert sigma > 0 and manifest["privacy"]["ledger"]["sigmas"].count(sigma) == cfg.rounds - 1
    assert manifest["privacy"]["plan"]["histograms"] == (2 if far_votes == "on" else 1)
    residuals = noise_residuals(cfg, tmp_path / "out")
    assert residuals.size >= 90
    # std estimated from ~180 draws is within ~5 %; 25 % leaves room and still catches sigma/2
    assert abs(residuals.std() / sigma - 1) < 0.25
    assert abs(residuals.mean()) < 4 * sigma / np.sqrt(residuals.size)


class Killed(BaseException):
    """Stands for SIGKILL: nothing in the pipeline may catch it."""


class DiesInRound1(FakeEngineForUnitTests):
    def generate(self, prompts, seeds, params):
        if self.calls >= 1:  # its first call is round 0; the next one is round 1
            raise Killed
        return super().generate(prompts, seeds, params)


def test_noise_key_is_secret_private_and_read_back_on_resume(tmp_path):
    cfg = config(write_private(tmp_path / "p.csv"))
    out = tmp_path / "killed"
    with pytest.raises(Killed):
        run(cfg, out, {"a": DiesInRound1("a"), "b": FakeEngineForUnitTests("b")})
    store = RunStore(out)
    key = store.key_path.read_text()
    assert store.key_path.stat().st_mode & 0o777 == 0o600
    assert store.private.stat().st_mode & 0o777 == 0o700
    assert RunStore(out).load_state().completed_rounds == 1  # round 0 voted with the key

    engines: dict = {}
    manifest = run(cfg, out, engines, resume=True)
    # read back, not made again (a new key fails the state's check value), then deleted at the end
    assert not store.key_path.exists()
    # the resumed run generated rounds 1 and 2 only: never a zero-shot (round 0) prompt again
    prompts = [p for e in engines.values() for p in e.prompts]
    assert prompts and not any(p.startswith("A patient's review") for p in prompts)
    assert sorted({r["round"] for r in manifest["rounds"]}) == [0, 1, 2]

    # an uninterrupted run with the same key writes the same bytes: the resumed noise is that key's
    same_key = tmp_path / "same-key"
    (same_key / "private").mkdir(parents=True)
    (same_key / "private" / "noise.key").write_text(key)
    (same_key / "private" / "noise.key").chmod(0o600)
    run(cfg, same_key, resume=True)  # nothing to resume: a fresh run that finds its key
    assert (same_key / "synthetic.parquet").read_bytes() == (out / "synthetic.parquet").read_bytes()

    for name in ("manifest.json", "private/state.json"):
        text = (out / name).read_text()
        assert key not in text and key[:16] not in text, f"the noise key is in {name}"


def test_a_new_key_per_run_and_a_fixed_seed_voids_the_guarantee(tmp_path):
    private = write_private(tmp_path / "p.csv")
    first = run(config(private), tmp_path / "one")
    run(config(private), tmp_path / "two")
    checks = [RunStore(tmp_path / d).load_state().noise_key_check for d in ("one", "two")]
    assert None not in checks and checks[0] != checks[1]  # the keys themselves are gone
    assert not first["privacy"]["epsilon_void"] and "DP" in first["privacy"]["guarantee"]
    fixed = run(config(private, noise_seed=7), tmp_path / "fixed")
    assert fixed["privacy"]["epsilon_void"] and fixed["privacy"]["guarantee"].startswith("VOID")
    assert not (tmp_path / "fixed/private/noise.key").exists()
    assert fixed["config"]["noise_seed"] is None  # the seed itself is not published


def test_published_timings_leave_out_private_work(tmp_path):
    manifest = run(config(write_private(tmp_path / "p.csv")), tmp_path / "out")
    timings = manifest["timings_s"]
    assert any(k.startswith("generation:") for k in timings)
    assert not any("private" in k or "voting" in k for k in timings)
    state = json.loads((tmp_path / "out/private/state.json").read_text())["state"]
    assert {"private:embedding", "private:voting"} <= set(state["timings"])  # the operator keeps them


def test_resume_refuses_another_noise_seed(tmp_path):
    private = write_private(tmp_path / "p.csv")
    out = tmp_path / "out"
    with pytest.raises(Killed):
        run(config(private, noise_seed=1), out, {"a": DiesInRound1("a"), "b": FakeEngineForUnitTests("b")})
    with pytest.raises(Exception, match="not the noise key of the run"):
        run(config(private, noise_seed=2), out, resume=True)


def test_federated_noise_comes_from_the_full_secret_key(tmp_path, monkeypatch):
    """Each party's share is a stream of the 256-bit run secret (never a short, guessable seed)."""
    import wasp_vllm.privacy.mechanisms as mechanisms

    streams = []
    real = mechanisms.federated_noisy_votes

    def spy(*args, noise, **kwargs):
        streams.append([noise(p) for p in range(3)])
        return real(*args, noise=noise, **kwargs)

    monkeypatch.setattr(mechanisms, "federated_noisy_votes", spy)
    run(config(write_private(tmp_path / "p.csv"), parties=3), tmp_path / "out")
    assert len(streams) == 2  # T=3: two voting rounds
    seeds = [g.bit_generator.seed_seq.entropy for per_round in streams for g in per_round]
    assert len(set(seeds)) == 6  # one stream per (round, party)
    assert all(seed >= 2**192 for seed in seeds)  # 256 secret bits, not 31


def test_the_config_fingerprint_does_not_hash_the_noise_seed(tmp_path):
    private = write_private(tmp_path / "p.csv")
    assert config(private, noise_seed=1).fingerprint() == config(private, noise_seed=2).fingerprint()
    assert config(private, noise_seed=1).fingerprint() != config(private, q=3).fingerprint()
