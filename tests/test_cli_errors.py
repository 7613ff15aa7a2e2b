"""A user's mistake, through the real CLI: one ``error:`` line, exit code 2, no traceback, no files.

Every case must be refused before any model loads: an autouse fixture replaces the engine
factory and the embedder with tripwires, so a case that got as far as loading a model fails.
PLMs are tiny fake model directories (a config.json and an empty weights file) that resolve
like real ones but are never loaded. The one case that is allowed to run (a label without
private records) runs the real pipeline with ``FakeEngineForUnitTests`` and
``HashEmbedderForTests`` (named as such: the subject is the CLI's handling, not an LLM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import wasp_vllm.engines.embedder
import wasp_vllm.pipeline
from tests.fakes import WORDS, FakeEngineForUnitTests, HashEmbedderForTests, use_fake_backends
from wasp_vllm.cli import app
from wasp_vllm.config import EngineArgs, RunConfig
from wasp_vllm.pipeline import Run, prepare

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["positive", "neutral", "negative"]


def _records(n: int = 30, labels: list[str] = LABELS) -> list[tuple[str, str]]:
    words = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8)) for i in range(n)]
    return [(f"record {i} {words[i]}", labels[i % len(labels)]) for i in range(n)]


def write_csv(path: Path, rows: list[tuple[str, str]], header: str = "text,label") -> Path:
    path.write_text(header + "\n" + "".join(f"{t},{label}\n" for t, label in rows))
    return path


def fake_model_dir(path: Path) -> Path:
    """Resolves as a model directory (config.json + weights file); loading it would fail."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"")
    return path


class ModelLoaded(AssertionError):
    """A model was loaded although the input should have been refused first."""


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    def tripwire(*args, **kwargs):
        raise ModelLoaded("a model was loaded before the input was validated")

    monkeypatch.setattr("wasp_vllm.pipeline.backends.make_engine", tripwire)
    monkeypatch.setattr(wasp_vllm.engines.embedder, "Embedder", tripwire)


@pytest.fixture()
def env(tmp_path):
    """A valid set of arguments; each case breaks one thing."""
    private = write_csv(tmp_path / "private.csv", _records())
    a, b = fake_model_dir(tmp_path / "tiny-a"), fake_model_dir(tmp_path / "tiny-b")
    out = tmp_path / "out"
    base = {
        "--plms": f"{a},{b}",
        "--task": "drugs",
        "--private": str(private),
        "--n": "36",
        "--rounds": "3",
        "--q": "2",
        "--s": "2",
        "--embedder": "minilm",
        "--out": str(out),
    }
    return tmp_path, base, out


def invoke(base: dict[str, str], *extra: str, **changes: str | None):
    args = dict(base)
    for key, value in changes.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            args.pop(flag, None)
        else:
            args[flag] = value
    argv = ["generate", *[x for kv in args.items() for x in kv], *extra]
    return CliRunner().invoke(app, argv)


def assert_refused(result, expected: str) -> str:
    """Exit 2, exactly one ``error:`` line that says ``expected``, no traceback; returns that line."""
    output = result.output
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    assert expected in lines[0], lines[0]
    return lines[0]


def assert_nothing_written(out: Path) -> None:
    assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))


def _bad_input_cases(tmp: Path) -> list[tuple[str, dict, str]]:
    """(case id, changed arguments, expected part of the error line)."""
    rows = _records()
    bad_utf8 = tmp / "binary.csv"
    bad_utf8.write_bytes(b"text,label\n\xff\xfe\x00garbage\x9c,positive\n")
    csv_as_parquet = tmp / "csv.parquet"
    csv_as_parquet.write_text("text,label\nhello there,positive\n")
    ragged = tmp / "ragged.csv"
    ragged.write_text("text,label\nhello there,positive\nthis row,has,three cells\n")
    (tmp / "a-directory.csv").mkdir()
    (tmp / "empty.csv").write_bytes(b"")
    not_a_model = tmp / "not-a-model"
    not_a_model.mkdir()
    no_weights = tmp / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    a_file = tmp / "weights.bin"
    a_file.write_bytes(b"\0")
    return [
        ("missing-file", {"private": str(tmp / "nope.csv")}, "file not found"),
        ("directory-not-file", {"private": str(tmp / "a-directory.csv")}, "not a regular file"),
        ("not-utf8", {"private": str(bad_utf8)}, "text column 'text' is not UTF-8 text"),
        ("unknown-extension", {"private": str(write_csv(tmp / "data.txt", rows))}, "unknown file type .txt"),
        ("csv-named-parquet", {"private": str(csv_as_parquet)}, "could not be parsed as parquet"),
        ("ragged-csv", {"private": str(ragged)}, "could not be parsed as csv"),
        ("missing-text-column", {"text_col": "review"}, "no text column 'review'"),
        ("missing-label-column", {"label_col": "rating"}, "no label column 'rating'"),
        ("empty-file", {"private": str(tmp / "empty.csv")}, "file is empty"),
        ("header-only", {"private": str(write_csv(tmp / "header.csv", []))}, "the table has no records"),
        (
            "null-text",
            {"private": str(write_csv(tmp / "nulls.csv", [*rows, ("", "positive")]))},
            "nulls.csv: a record has a null or empty text in column 'text'; fix or remove such records",
        ),
        (
            "labels-not-in-task",
            {"private": str(write_csv(tmp / "l.csv", [*rows, ("odd one", "spam")]))},
            "a record has a label in column 'label' that is not a label of task 'drugs'",
        ),
        ("unknown-task", {"task": "no-such-task"}, "no-such-task"),
        ("m-below-q", {"m": "5", "q": "8", "n": "300", "s": "2"}, "--m 5 draws fewer records than q=8"),
        (
            "private-label-prior-with-parties",
            {"label_prior": "private", "parties": "3"},
            "label_prior=private cannot be used with parties",
        ),
        ("s-larger-than-pools", {"s": "50"}, "s=50 is larger than any pool"),
        ("epsilon-zero", {"epsilon": "0"}, "epsilon: Input should be greater than 0"),
        ("epsilon-negative", {"epsilon": "-1"}, "epsilon: Input should be greater than 0"),
        ("delta-zero", {"delta": "0"}, "delta: Input should be greater than 0"),
        ("delta-one", {"delta": "1"}, "delta: Input should be less than 1"),
        ("delta-above-one", {"delta": "1.5"}, "delta: Input should be less than 1"),
        ("n-below-plms-x-labels", {"n": "5", "rounds": "1"}, "n=5 is too small"),
        ("rounds-zero", {"rounds": "0"}, "rounds: Input should be greater than or equal to 1"),
        ("rounds-above-n", {"rounds": "40"}, "n=36 is smaller than rounds=40"),
        ("unknown-plm", {"plms": f"{tmp / 'tiny-a'},no-such-plm"}, "unknown PLM 'no-such-plm'"),
        ("plm-named-twice", {"plms": f"{tmp / 'tiny-a'},{tmp / 'tiny-a'}"}, "each PLM may be named once"),
        ("unknown-embedder", {"embedder": "no-such-embedder"}, "unknown embedder 'no-such-embedder'"),
        ("plm-dir-not-a-model", {"plms": str(not_a_model)}, "is not a model directory"),
        ("plm-file-not-a-model", {"plms": str(a_file)}, "is not a model directory"),
        ("plm-dir-without-weights", {"plms": str(no_weights)}, "has a config.json but no weights"),
        ("openai-without-endpoint", {"engine": "openai"}, "the openai engine needs an endpoint"),
        ("bad-endpoint", {"plms": "tiny@ftp://host/v1"}, "must be an http(s) URL"),
        ("unknown-strategy", {"strategy": "magic"}, "strategy: unknown strategy 'magic'; one of wasp,"),
    ]


def test_every_bad_input_is_one_clear_line(env):
    """All cases in one test (one setup) to stay quick; a failure names its case."""
    tmp, base, out = env
    for case, changes, expected in _bad_input_cases(tmp):
        result = invoke(base, **changes)
        try:
            assert_refused(result, expected)
            assert_nothing_written(out)
        except AssertionError as exc:
            raise AssertionError(f"case {case}: {exc}") from None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file regardless of its mode")
def test_unreadable_file(env):
    tmp, base, out = env
    locked = write_csv(tmp / "locked.csv", _records())
    locked.chmod(0)
    assert_refused(invoke(base, private=str(locked)), "cannot be read (Permission denied)")
    assert_nothing_written(out)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("run.toml", "n = 36\nbogus = 1\n", "unknown setting 'bogus'"),
        ("run.toml", "n = 36\nquality_gate = true\n", "quality_gate: measured, not adopted and removed"),
        ("run.yaml", "n: 36\nepsilonn: 2\n", "unknown setting 'epsilonn' (did you mean 'epsilon'?)"),
        ("run.toml", "n = [1, 2\n", "could not be parsed"),
        ("run.json", "{}", "must end in .toml, .yaml or .yml"),
        ("run.yaml", "- a list\n- of things\n", "must hold a table of settings"),
        ("run.toml", 'epsilon = "lots"\n', "epsilon: Input should be a valid number"),
    ],
)
def test_bad_config_file(env, name, text, expected):
    tmp, base, out = env
    path = tmp / name
    path.write_text(text)
    assert_refused(invoke(base, config=str(path)), expected)
    assert_nothing_written(out)


def test_a_private_label_prior_with_parties_is_refused_from_a_file_and_from_python(env):
    """It would pool every party's exact labels on the server (issue 21, item 4): refused however
    it is asked for (the command line is a case of test_every_bad_input_is_one_clear_line)."""
    import wasp_vllm
    from wasp_vllm.config import ConfigError

    tmp, base, out = env
    path = tmp / "run.toml"
    path.write_text('label_prior = "private"\nparties = 3\n')
    assert_refused(invoke(base, config=str(path)), "label_prior=private cannot be used with parties")
    with pytest.raises(ConfigError, match="label_prior=private cannot be used with parties"):
        wasp_vllm.generate(base["--private"], out=out, plms=["a", "b"], label_prior="private", parties=3)
    assert_nothing_written(out)
    assert RunConfig(parties=3).label_prior == "uniform"  # 'auto' resolves to uniform with parties


def test_missing_config_file(env):
    tmp, base, out = env
    assert_refused(invoke(base, config=str(tmp / "absent.toml")), "does not exist")
    assert_nothing_written(out)


def test_out_is_a_file(env):
    tmp, base, _ = env
    target = tmp / "taken"
    target.write_text("not a directory")
    assert_refused(invoke(base, out=str(target)), "exists and is not a directory")
    assert target.read_text() == "not a directory"


def _finished_run(tmp: Path, base: dict[str, str], out: Path) -> dict[str, bytes]:
    """A real run (fake engine, hash embedder) in ``out``; returns its files' bytes."""
    cfg = RunConfig(
        plms=["tiny-a", "tiny-b"], private=base["--private"], private_limit=None, n=36, rounds=3,
        q=2, s=2, noise_seed=1, engine_args=EngineArgs(concurrent=False),
    )  # fmt: skip

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return FakeEngineForUnitTests(name)

    Run(prepare(cfg), out, engine_factory=factory, embedder=HashEmbedderForTests()).execute()
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_out_holding_another_run_is_refused_unless_asked(env):
    tmp, base, out = env
    before = _finished_run(tmp, base, out)
    after = lambda: {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}  # noqa: E731
    # different settings, no flag: refused
    assert_refused(invoke(base, epsilon="2"), "already holds a run; pass --resume")
    # --resume with different settings: refused, the run is untouched
    assert_refused(invoke(base, "--resume", epsilon="2"), "--resume with different settings")
    # both flags: refused rather than guessing which one was meant
    assert_refused(invoke(base, "--resume", "--overwrite"), "--resume and --overwrite exclude each other")
    assert after() == before
    # the refusal comes before the data is read and before any model name is resolved
    assert_refused(invoke(base, plms="no-such-plm", private="absent.csv"), "already holds a run")


def test_overwrite_replaces_the_run(env, monkeypatch):
    tmp, base, out = env
    _finished_run(tmp, base, out)
    use_fake_backends(monkeypatch)
    result = invoke(base, "--overwrite", epsilon="2")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["config"]["epsilon"] == 2.0


def test_corrupted_checkpoint_is_refused_on_resume(env):
    tmp, base, out = env
    _finished_run(tmp, base, out)
    state = json.loads((out / "private" / "state.json").read_text())
    state["state"]["weights"] = [0.9, 0.1]  # edited without updating its checksum
    (out / "private" / "state.json").write_text(json.dumps(state))
    assert_refused(
        invoke(base, "--resume", **_same_settings()), "state.json is corrupted (checksum mismatch)"
    )
    (out / "private" / "state.json").write_text("{not json")
    assert_refused(invoke(base, "--resume", **_same_settings()), "state.json is corrupted (not a valid")


def _same_settings() -> dict[str, str]:
    return {"noise_seed": "1"}


def test_label_without_private_records_runs_and_says_so_only_at_debug(env, monkeypatch):
    """Decision: allowed. Its samples get noise-only votes.  Whether a label has private records
    is a fact about the private data, so the default output says nothing; -v says it, marked
    as private."""
    tmp, base, out = env
    two_labels = write_csv(tmp / "two.csv", _records(30, ["positive", "negative"]))
    use_fake_backends(monkeypatch)
    result = invoke(base, private=str(two_labels), noise_seed="1")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "no records" not in result.output and "neutral" not in result.output
    verbose = invoke(base, "--verbose", "--overwrite", private=str(two_labels), noise_seed="1")
    assert verbose.exit_code == 0, verbose.output
    flat = " ".join(verbose.output.split())
    assert "[private" in flat and "labels with no records: neutral" in flat
    table = pq.read_table(out / "synthetic.parquet")
    assert table.num_rows == 36
    assert set(table.column("label").to_pylist()) == set(LABELS)  # the label is still generated
    manifest = json.loads((out / "manifest.json").read_text())
    assert "records_per_label" not in manifest["private_data"]  # exact private counts stay out


def test_real_process_prints_no_traceback(env):
    """The same through ``python -m wasp_vllm``: the real stderr of a real process."""
    tmp, base, out = env
    cases = [
        ({"private": str(tmp / "nope.csv")}, "file not found"),
        ({"plms": f"{tmp / 'tiny-a'},no-such-plm"}, "unknown PLM 'no-such-plm'"),
    ]
    for changes, expected in cases:
        args = {**base, **{"--" + k: v for k, v in changes.items()}}
        argv = [sys.executable, "-m", "wasp_vllm", "generate", *[x for kv in args.items() for x in kv]]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and expected in lines[0], proc.stderr
        assert_nothing_written(out)


def test_parquet_private_file_with_missing_column(env):
    tmp, base, out = env
    path = tmp / "private.parquet"
    pq.write_table(pa.table({"body": ["a b c", "d e f"], "label": ["positive", "negative"]}), path)
    assert_refused(
        invoke(base, private=str(path)), "no text column 'text'; available columns: ['body', 'label']"
    )
    assert_nothing_written(out)
