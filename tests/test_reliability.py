"""Crashes, failing engines and the privacy boundary of a run.

The subject is the round loop, its checkpoints and what leaves it, not an LLM or an embedder,
so generation comes from ``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests``
(both in tests/fakes.py, named as such); voting, noise, the ledger, selection and Parquet I/O
are the real ones. Crashes are real: a subprocess runs the pipeline and SIGKILLs itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import wasp_vllm.pipeline.context
from tests.fakes import (
    WORDS,
    DiesInRoundForTests,
    FakeEngineForUnitTests,
    HashEmbedderForTests,
    KilledForTests,
    use_fake_backends,
)
from tests.privacy_checks import assert_no_leak, files_of, leaks, private_texts
from wasp_vllm.cli import app
from wasp_vllm.config import ConfigError, RunConfig
from wasp_vllm.data.records import Columns, DataError, load_private
from wasp_vllm.pipeline import Run, prepare, privacy_plan
from wasp_vllm.pipeline.policy import DEFAULT_POLICY
from wasp_vllm.pipeline.store import LOCK_FILE, CheckpointError, RunStore
from wasp_vllm.privacy.accountant import PrivacyBudgetExceeded, PrivacyLedger
from wasp_vllm.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["positive", "neutral", "negative"]


def write_private(path: Path, n: int = 30, canaries: list[str] | None = None) -> Path:
    rng = np.random.default_rng(0)
    lines = ["text,label"]
    for i in range(n):
        words = " ".join(rng.choice(WORDS, size=10))
        prefix = f"{canaries[i]} " if canaries else ""
        lines.append(f"{prefix}record {i} {words},{LABELS[i % 3]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def settings(private: Path, **kw) -> dict:
    base = dict(plms=["a", "b"], task="drugs", private=str(private), private_limit=None, n=36, rounds=3,
                q=2, s=2, noise_seed=123, engine_args={"concurrent": False})  # fmt: skip
    return base | kw


def run_in_process(cfg: RunConfig, out: Path, engines: dict | None = None, **kw) -> dict:
    engines = engines if engines is not None else {}

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return engines.setdefault(name, FakeEngineForUnitTests(name))

    # the published manifest.json's content
    return (
        Run(prepare(cfg), out, engine_factory=factory, embedder=HashEmbedderForTests())
        .execute(**kw)
        .to_json()
    )


# --- kill -9 and --resume ------------------------------------------------------------------------


def run_subprocess(cfg_path: Path, out: Path, *extra: str, kill_at: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "WASP_TEST_KILL_AT"}
    if kill_at:
        env["WASP_TEST_KILL_AT"] = kill_at
    cmd = [sys.executable, "-m", "tests.fakes", str(cfg_path), str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def crash_setup(tmp_path_factory):
    """An uninterrupted run of the same settings, to compare the resumed runs against."""
    tmp = tmp_path_factory.mktemp("crash")
    cfg_path = tmp / "cfg.json"
    # with a private label prior: its histogram is a release the resumed run must not pay twice
    cfg_path.write_text(json.dumps(settings(write_private(tmp / "private.csv"), label_prior="private")))
    proc = run_subprocess(cfg_path, tmp / "full")
    assert proc.returncode == 0, proc.stderr
    return tmp, cfg_path, tmp / "full"


def _comparable(manifest: dict) -> dict:
    """The manifest without what legitimately differs between processes (timings, versions)."""
    rounds = [{k: v for k, v in r.items() if k != "seconds"} for r in manifest["rounds"]]
    keep = ("config", "private_data", "plms", "privacy", "output", "tokens")
    return {k: manifest[k] for k in keep} | {"rounds": rounds}


# T=3: round 0 = engine calls 1 (a) and 2 (b), then vote 1; round 1 = calls 3, 4, vote 2; round 2 = 5, 6.
CRASHES = {
    "generate:3": "in the middle of round 1's generation",
    "vote:2": "inside round 1's voting, before its noisy histograms exist",
    "write_round:2": "half-way through writing round 1's Parquet file",
    "save_state:2": "after round 1's Parquet file is in place, before its state is saved",
    "write_final:1": "half-way through writing the final synthetic.parquet",
}


@pytest.mark.parametrize("kill_at", list(CRASHES))
def test_sigkill_then_resume_gives_the_uninterrupted_output(crash_setup, kill_at):
    """Byte-identical synthetic.parquet: every round is a deterministic function of the seeds and the
    checkpointed state (weights, pools, ledger), the noise seed is fixed (``noise_seed``; with a
    secret key the key file is kept beside the checkpoint), and the final file is rebuilt from the
    round files, so a resumed run writes the same rows in the same order with the same writer."""
    tmp, cfg_path, full = crash_setup
    out = tmp / kill_at.replace(":", "-")
    killed = run_subprocess(cfg_path, out, kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    assert not (out / "manifest.json").exists() and not (out / "synthetic.parquet").exists()
    state = RunStore(out).load_state()  # the checkpoint on disk is whole and verifies
    assert state is not None and state.completed_rounds == (3 if kill_at == "write_final:1" else 1)
    if kill_at.startswith("write_"):
        assert RunStore(out).stale_temp_files(), "the kill should have left half a file"
    if kill_at == "generate:3":  # once is enough: without --resume the killed run is refused
        again = run_subprocess(cfg_path, out)
        assert again.returncode != 0 and "already holds a run" in again.stderr
    resumed = run_subprocess(cfg_path, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "synthetic.parquet").read_bytes() == (full / "synthetic.parquet").read_bytes()
    a = json.loads((full / "manifest.json").read_text())
    b = json.loads((out / "manifest.json").read_text())
    assert _comparable(a) == _comparable(b)
    # the killed round's vote (and the label prior) are not counted twice: 2 votes + 1 histogram
    assert b["privacy"]["ledger"]["compositions"] == 3
    assert not RunStore(out).stale_temp_files()


def test_corrupted_checkpoints_are_detected(tmp_path):
    """Checksums in state.json cover itself and every round file; a keyed check value the noise key."""
    cfg = RunConfig(**settings(write_private(tmp_path / "p.csv"), noise_seed=None))
    out = tmp_path / "out"
    # Killed in round 2: its noise key is still needed and kept.  Both PLMs die there: the noise is
    # secret, so the votes may leave either one without a share in round 2 (seen once: never called).
    dying = {name: DiesInRoundForTests(out, 2, name) for name in ("a", "b")}
    with pytest.raises(KilledForTests):
        run_in_process(cfg, out, dying)
    private = out / "private"
    key = private / "noise.key"
    checked = [
        private / "state.json",
        private / "rounds" / "round-001.parquet",
        private / "rounds" / "votes-000.parquet",
    ]
    files = {p: p.read_bytes() for p in [*checked, key]}

    def corrupt(path: Path, data: bytes, expected: str) -> None:
        path.write_bytes(data)
        with pytest.raises(CheckpointError, match=expected):
            run_in_process(cfg, out, resume=True)
        path.write_bytes(files[path])  # restore for the next case

    round1 = private / "rounds" / "round-001.parquet"
    corrupt(round1, files[round1][:-20] + b"x" * 20, r"rounds/round-001.parquet is missing or corrupted")
    corrupt(round1, (private / "rounds" / "round-000.parquet").read_bytes(), r"round-001.parquet .*corrupted")
    corrupt(
        private / "rounds" / "votes-000.parquet", b"x", r"rounds/votes-000.parquet is missing or corrupted"
    )
    state = json.loads(files[private / "state.json"])
    # A change to what the votes decided; [1.0, 0.0] was a no-op when the noisy votes had left one
    # PLM without a share already (seen once in 40 runs).
    state["state"]["weights"] = [w + 0.125 for w in state["state"]["weights"]]
    corrupt(private / "state.json", json.dumps(state).encode(), "checksum mismatch")
    corrupt(private / "state.json", b'{"state": {}}', "checksum mismatch")
    corrupt(key, b"12345", r"noise\.key is corrupted")
    corrupt(key, bytes(64).hex().encode()[:64], r"noise\.key .*is not the noise key of the run")
    key.unlink()
    with pytest.raises(CheckpointError, match=r"noise\.key is missing"):
        run_in_process(cfg, out, resume=True)
    key.write_bytes(files[key])
    key.chmod(0o644)  # as a plain copy with the usual umask leaves it
    with pytest.raises(ValueError, match=r"noise key is accessible to other users \(mode 644\)"):
        run_in_process(cfg, out, resume=True)
    key.chmod(0o600)
    run_in_process(cfg, out, resume=True)  # intact again: resumes
    assert not key.exists()  # and, finished, deletes the key


# --- failing engines -----------------------------------------------------------------------------


def test_transient_engine_failure_is_retried_and_dropped_plms_are_recorded(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="wasp_vllm")
    engines = {
        "a": FakeEngineForUnitTests("a", fail_calls=[2]),  # fails once, in round 1, then recovers
        "b": FakeEngineForUnitTests("b"),
        "c": FakeEngineForUnitTests("c", fail_after=1),  # fails for good from round 1 on
    }
    cfg = RunConfig(
        **settings(write_private(tmp_path / "p.csv"), plms=["a", "b", "c"], engine_args={"engine_retries": 2})
    )
    manifest = run_in_process(cfg, tmp_path / "out", engines)
    table = pq.read_table(tmp_path / "out" / "synthetic.parquet")
    assert table.num_rows == 36
    by_round = {t: set() for t in range(3)}
    for t, plm in zip(table.column("round").to_pylist(), table.column("plm").to_pylist(), strict=True):
        by_round[t].add(plm)
    assert by_round == {0: {"a", "b", "c"}, 1: {"a", "b"}, 2: {"a", "b"}}
    assert "a" not in manifest["plms"]["dropped"]
    assert engines["c"].calls == 1 + 3  # round 0, then one try and two retries in round 1
    assert manifest["plms"]["active"] == ["a", "b"]
    assert list(manifest["plms"]["dropped"]) == ["c"]
    assert manifest["rounds"][1]["kept"]["a"] + manifest["rounds"][1]["kept"]["b"] == 12  # c's share moved
    assert manifest["rounds"][2]["quotas"]["c"] == 0
    assert "engine a failed (MemoryError, try 1 of 3)" in caplog.text
    assert "PLM c failed repeatedly (MemoryError); continuing without it" in caplog.text


def test_a_dropped_plm_keeps_weight_zero(tmp_path):
    engines = {"a": FakeEngineForUnitTests("a"), "b": FakeEngineForUnitTests("b", fail_after=1)}
    cfg = RunConfig(**settings(write_private(tmp_path / "p.csv"), engine_args={"engine_retries": 0}))
    manifest = run_in_process(cfg, tmp_path / "out", engines)
    assert list(manifest["plms"]["dropped"]) == ["b"]
    assert [r["weights_after"][1] for r in manifest["rounds"][1:]] == [0.0, 0.0]
    assert manifest["plms"]["final_weights"] == [1.0, 0.0]


# --- the privacy boundary ------------------------------------------------------------------------


@pytest.fixture()
def canaries() -> list[str]:
    return [f"CANARY{uuid.uuid4().hex}" for _ in range(30)]


def _assert_clean(text: str | bytes, canaries: list[str], where: str) -> None:
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    assert "CANARY" not in text, f"a private canary leaked into {where}"
    assert not any(c in text for c in canaries), where


def test_private_text_never_leaves_a_cli_run(tmp_path, monkeypatch):
    """Output, every log record (DEBUG), every prompt and every file of a full CLI run, the
    operator's own files included; any 16-character window of a record counts, whatever its case
    and spacing, and Parquet files are searched as data (they are compressed on disk)."""
    texts = private_texts(30, seed=5)
    private = tmp_path / "private.csv"
    private.write_text("text,label\n" + "".join(f"{t},{LABELS[i % 3]}\n" for i, t in enumerate(texts)))
    engines = use_fake_backends(monkeypatch)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logging.getLogger("wasp_vllm").addHandler(handler)
    try:
        out = tmp_path / "out"
        argv = ["generate", "--plms", "a,b", "--private", str(private), "--n", "36", "--rounds", "3",
                "--q", "2", "--s", "2", "--out", str(out), "--verbose"]  # fmt: skip
        result = CliRunner().invoke(app, argv)
    finally:
        logging.getLogger("wasp_vllm").removeHandler(handler)
    assert result.exit_code == 0, result.output
    assert records and any(r.levelno == logging.DEBUG for r in records)
    prompts = [p for e in engines.values() for p in e.prompts]
    assert len(prompts) >= 36
    files = files_of(out)
    assert {Path(name).name for name, _ in files} >= {"manifest.json", "synthetic.parquet", "state.json"}
    blobs = [("the CLI's output", result.output), ("the log", "\n".join(r.getMessage() for r in records)),
             ("a prompt", "\n".join(prompts)), *files]  # fmt: skip
    assert_no_leak(blobs, texts)
    assert leaks("xx " + texts[3].lower().replace(" ", "  ") + " yy", texts), "the detector itself works"


def test_private_text_never_in_an_error(tmp_path, canaries):
    """Parser, label and column errors on files whose cells hold the canaries."""
    task = get_task("drugs")
    c = canaries
    cases = {
        "ragged.csv": f"text,label\n{c[0]} ok,positive\n{c[1]},has,three cells {c[2]}\n",
        "labels.csv": f"text,label\nfine text,{c[3]}\nother text,positive\n",
        "quote.csv": f'text,label\n"{c[4]} never closed,positive\n',
        "broken.jsonl": f'{{"text": "{c[5]}", "label": "positive"}}\n{{"text": "{c[6]}", "label": \n',
        "array.json": f'[{{"text": "{c[7]}", "label": "positive"}}, "{c[8]}"]',
        "empty-text.csv": f"text,label\n,positive\n{c[9]},negative\n",
        "latin1.csv": f"text,label\n{c[10]} caf\xe9,positive\n".encode("latin-1"),
        "users.csv": f"text,label,user\n{c[11]},positive,\n{c[12]},negative,u1\n",
    }
    messages = []
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(DataError) as info:
            load_private(str(path), task, Columns(user="user" if name == "users.csv" else None))
        messages.append(str(info.value))
        exc = info.value  # the parser's own exception (which may quote a row) is not chained
        assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)
        extra = ["--user-col", "user"] if name == "users.csv" else []
        argv = ["generate", "--private", str(path), "--out", str(tmp_path / "o"), *extra]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and "error:" in result.output
        messages.append(result.output)
    for text in messages:
        _assert_clean(text, canaries, "an error message")
    assert not (tmp_path / "o").exists()


def test_ledger_refuses_to_exceed_the_budget():
    cfg = RunConfig(plms=["a"], rounds=3, q=2, epsilon=1.0, delta=1e-5, label_prior="uniform")
    plan = privacy_plan(cfg)
    ledger = PrivacyLedger(cfg.epsilon, cfg.delta)
    for t in range(2):  # the planned T-1 releases fit, to rounding
        ledger.record(plan.release(t))
    assert ledger.spent_epsilon() == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(PrivacyBudgetExceeded, match="over the budget epsilon=1"):
        ledger.record(plan.release(2))
    assert len(ledger.releases) == 2  # refused before it was appended
    with pytest.raises(PrivacyBudgetExceeded):
        PrivacyLedger(1.0, 1e-5).record(dataclasses.replace(plan.release(0), sigma=plan.sigma / 2))


def test_run_with_too_little_noise_is_refused_before_anything_is_released(tmp_path, monkeypatch):
    """Through the CLI: a plan whose sigma would overspend is stopped by the ledger at the first vote."""
    real = wasp_vllm.pipeline.context.privacy_plan
    monkeypatch.setattr(
        wasp_vllm.pipeline.context,
        "privacy_plan",
        lambda cfg, policy=DEFAULT_POLICY: dataclasses.replace(real(cfg, policy), sigma=0.05),
    )
    use_fake_backends(monkeypatch)
    out = tmp_path / "out"
    private = write_private(tmp_path / "p.csv")
    argv = ["generate", "--plms", "a,b", "--private", str(private), "--n", "36", "--rounds", "3",
            "--q", "2", "--s", "2", "--noise-seed", "1", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert "release for round 0 would spend epsilon=" in line and "over the budget epsilon=4" in line
    written = [p.name for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE]  # the run's lock
    assert written == ["README.txt"]  # no round, state or output was written (only the folder's README)


def test_fingerprint_of_the_private_data_is_keyed_and_stays_with_the_operator(tmp_path):
    base = write_private(tmp_path / "p.csv")
    lines = base.read_text().splitlines()
    shuffled = tmp_path / "shuffled.csv"
    shuffled.write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    edited = tmp_path / "edited.csv"
    edited.write_text("\n".join([*lines[:5], lines[5].replace("record 4", "record 4!"), *lines[6:]]) + "\n")
    relabelled = tmp_path / "relabelled.csv"
    relabelled.write_text(
        "\n".join([*lines[:2], lines[2].replace(",neutral", ",negative"), *lines[3:]]) + "\n"
    )

    def fingerprint(private: Path, out: str) -> str:
        manifest = run_in_process(RunConfig(**settings(private)), tmp_path / out)
        assert "fingerprint" not in json.dumps(manifest).replace(str(tmp_path), "")
        state = RunStore(tmp_path / out).load_state()
        assert state is not None
        return state.data_fingerprint

    first, second = fingerprint(base, "r1"), fingerprint(base, "r2")
    assert first == second and first.startswith("hmac-sha256:")  # the owner compares two runs
    assert fingerprint(shuffled, "r3") == first  # a multiset of records: the order does not matter
    assert fingerprint(edited, "r4") != first
    assert fingerprint(relabelled, "r5") != first
    data = load_private(str(base), get_task("drugs"))
    assert first != data.fingerprint(b"\0" * 32)  # keyed: another key gives another value
    base.write_text(edited.read_text())  # same settings, same path, one record edited
    with pytest.raises(ConfigError, match="different private data"):  # --resume refuses other data
        run_in_process(RunConfig(**settings(base)), tmp_path / "r1", resume=True)
