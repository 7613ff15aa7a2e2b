"""Issue 60, item 5: every failure a newcomer meets is one ``error:`` line and exit code 2, through
the real CLI; ``-v`` adds the traceback.

The cases that failed with a Python traceback (exit 1) or with a line that did not help: an
unwritable or vanished ``--out``, a missing ``--synthetic``, a read-only ``publish`` destination,
a run file with a syntax error (now with line and column), a csv separated by another character
(now named).  The machine here runs the tests as root, who may write any folder whatever its mode,
so "unwritable" is a folder on a read-only file system (/proc) or under a file; a chmod case runs
where the tests do not run as root.  Runs use ``FakeEngineForUnitTests`` and
``HashEmbedderForTests`` (named as such: the subject is the CLI's handling of failures, not an LLM).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fakes import FakeEngineForUnitTests, use_fake_backends
from tests.test_cli_errors import _finished_run, _records, assert_refused, write_csv
from wasp_vllm.cli import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def base(tmp_path, monkeypatch) -> dict[str, str]:
    """A run that would work (fake PLMs 'a' and 'b'); each case breaks one thing."""
    use_fake_backends(monkeypatch)
    private = write_csv(tmp_path / "private.csv", _records())
    return {"--plms": "a,b", "--task": "drugs", "--private": str(private), "--n": "36", "--rounds": "3",
            "--q": "2", "--s": "2", "--out": str(tmp_path / "out")}  # fmt: skip


def generate(base: dict[str, str], *extra: str, **changes: str):
    args = {**base, **{"--" + k.replace("_", "-"): v for k, v in changes.items()}}
    return CliRunner().invoke(app, ["generate", *[x for kv in args.items() for x in kv], *extra])


def test_an_out_folder_that_cannot_be_written_is_one_line_before_any_work(base, tmp_path):
    line = assert_refused(generate(base, out="/proc/wasp-vllm-run"), "--out /proc/wasp-vllm-run")
    assert "read-only file system" in line
    taken = tmp_path / "a-file"
    taken.write_text("x")
    assert_refused(generate(base, out=str(taken / "run")), "exists and is not a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes any folder regardless of its mode")
def test_a_read_only_out_folder_is_one_line(base, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert_refused(generate(base, out=str(locked / "run")), "is not writable")


def test_verbose_adds_the_traceback(base):
    result = generate(base, "-v", out="/proc/wasp-vllm-run")
    assert result.exit_code == 2
    assert "Traceback" in result.output
    assert sum(line.startswith("error:") for line in result.output.splitlines()) == 1


class RemovesTheRunForTests(FakeEngineForUnitTests):
    """Deletes the run's folder while round 1 generates: a user's ``rm -r`` under a running run."""

    def __init__(self, name: str, out: Path) -> None:
        super().__init__(name)
        self.out = out

    def generate(self, prompts, seeds, params):
        if (self.out / "private" / "rounds" / "round-000.parquet").exists():
            shutil.rmtree(self.out, ignore_errors=True)
        return super().generate(prompts, seeds, params)


def test_a_run_whose_folder_vanished_is_one_line(base, monkeypatch, tmp_path):
    out = tmp_path / "out"
    use_fake_backends(monkeypatch, {"a": RemovesTheRunForTests("a", out)})
    result = generate(base)
    assert_refused(result, str(out))


def test_missing_synthetic_file_is_one_line(tmp_path):
    args = ["evaluate", "--synthetic", str(tmp_path / "nope.parquet"), "--test", "drugs"]
    assert_refused(CliRunner().invoke(app, args), "nope.parquet: file not found")


def test_a_read_only_publish_destination_is_one_line(base, tmp_path):
    run = tmp_path / "run"
    _finished_run(tmp_path, {"--private": base["--private"]}, run)
    result = CliRunner().invoke(app, ["publish", str(run), "/proc/wasp-vllm-published"])
    assert "read-only file system" in assert_refused(result, "DEST /proc/wasp-vllm-published")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "run.toml",
            "n = 36\nrounds = [1, 2\n",
            "Unclosed array (at the end of the file: line 2, column 15)",
        ),
        ("run.toml", 'n = 36\ntask = "drugs\n', "(at line 2, column 14)"),
        ("run.yaml", "n: 36\n  rounds: 3\n", "at line 2, column 9"),
    ],
)
def test_a_run_file_syntax_error_names_line_and_column(base, tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert_refused(generate(base, config=str(path)), expected)


@pytest.mark.parametrize(("separator", "named"), [(";", "';'"), ("|", "'|'"), ("\t", "a tab")])
def test_a_csv_with_another_separator_says_which(base, tmp_path, separator, named):
    path = tmp_path / "semicolons.csv"
    rows = "".join(f"{text}{separator}{label}\n" for text, label in _records())
    path.write_text(f"text{separator}label\n{rows}")
    line = assert_refused(generate(base, private=str(path)), "semicolons.csv")
    assert f"looks separated by {named}, not by ','" in line
    assert "record" not in line.split("semicolons.csv")[1]  # no cell of the file is quoted


def test_a_real_process_prints_one_line_for_an_unwritable_out(base, tmp_path):
    """The same through ``python -m wasp_vllm``: the real stderr of a real process."""
    args = {**base, "--plms": "smollm2", "--out": "/proc/wasp-vllm-run"}
    argv = [sys.executable, "-m", "wasp_vllm", "generate", *[x for kv in args.items() for x in kv]]
    scratch = tmp_path / "tmp"  # where the engine log is made: nothing may be left there
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert not list(scratch.iterdir()), "a failed run left its engine log behind"
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "read-only file system" in lines[0], proc.stderr
    assert proc.stderr.splitlines() == lines  # the whole output: no empty progress line, nothing else
