"""Issue 73, items 6 to 10: a new user's first hour.

Generation comes from ``FakeEngineForUnitTests`` (and ``ChattyEngineForUnitTests``, which also
writes to the stderr descriptor as vLLM's engine processes do) and embeddings from
``HashEmbedderForTests``: the subject is what the commands do around the engines, not an LLM.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import wasp_vllm
from tests.fakes import DiesInRoundForTests, FakeEngineForUnitTests, HashEmbedderForTests, use_fake_backends
from tests.privacy_checks import private_texts
from wasp_vllm.cli import app
from wasp_vllm.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"

CHATTER = "chatter of the engine's library, as vLLM writes it"
SMALL = ["--plms", "a,b", "--n", "36", "--rounds", "3", "--q", "2", "--s", "2"]


class ChattyEngineForUnitTests(FakeEngineForUnitTests):
    """FAKE engine for unit tests: the base engine's samples, and a line written straight to the
    stderr descriptor at every call (as vLLM's engine process and C++ code do); it reports public
    facts about itself as the real engines do (the manifest's ``engines``)."""

    def generate(self, prompts, seeds, params):
        os.write(2, f"{CHATTER} ({self.name}, call {self.calls + 1})\n".encode())
        return super().generate(prompts, seeds, params)

    def stats(self) -> dict:
        return {"device": "cpu", "dtype": "bfloat16"}


class InterruptedForUnitTests(ChattyEngineForUnitTests):
    """FAKE engine for unit tests: at its ``at``-th call it looks where the engine log is, then
    the user presses Ctrl-C."""

    def __init__(self, name: str, out: Path, at: int) -> None:
        super().__init__(name)
        self.out, self.at = out, at
        self.seen: dict[str, object] = {}

    def generate(self, prompts, seeds, params):
        if self.calls + 1 == self.at:
            log = self.out / "private" / "engines.log"
            self.seen = {
                "log": log.read_text() if log.is_file() else None,
                "temporary": sorted(p.name for p in Path(tempfile.gettempdir()).iterdir()),
            }
            self.at = 0  # once
            raise KeyboardInterrupt
        return super().generate(prompts, seeds, params)


def _cli(*argv: str):
    return CliRunner().invoke(app, list(argv), env={"COLUMNS": "200"})


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


# --- item 6: a command that is refused or does nothing changes nothing ------------------------------


def test_a_refused_generate_and_a_resume_of_a_finished_run_change_nothing(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch, {p: ChattyEngineForUnitTests(p) for p in "ab"})
    monkeypatch.chdir(tmp_path)
    first = _cli("generate", *SMALL, "--out", "run")
    assert first.exit_code == 0, first.output
    run = tmp_path / "run"
    log = (run / "private" / "engines.log").read_text()
    assert CHATTER in log and CHATTER not in first.output  # the engines' chatter went to the run's log
    assert "engines" in (run / "manifest.json").read_text()
    before = _files(run)
    refused = _cli("generate", *SMALL, "--out", "run")
    assert refused.exit_code == 2 and "already holds a run" in refused.output
    assert _files(run) == before  # the engine log of the run is kept whole (it was emptied)
    resumed = _cli("generate", *SMALL, "--out", "run", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert _files(run) == before  # the manifest keeps its engines and the estimate its engine kinds
    assert "nothing to resume" in resumed.output


def test_the_engine_log_is_in_the_run_s_private_folder_from_the_start(tmp_path, monkeypatch):
    """A run stopped in any way leaves its engine log with the run, never in the temporary folder."""
    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    stopping = InterruptedForUnitTests("b", tmp_path / "run", at=2)
    use_fake_backends(monkeypatch, {"a": ChattyEngineForUnitTests("a"), "b": stopping})
    stopped = _cli("generate", *SMALL, "--out", "run")
    assert stopped.exit_code != 0
    assert stopping.seen["log"] is not None and CHATTER in str(stopping.seen["log"])
    assert not [name for name in stopping.seen["temporary"] if "wasp-vllm" in str(name)]
    log = tmp_path / "run" / "private" / "engines.log"
    stopped_log = log.read_text()
    assert CHATTER in stopped_log and not list(scratch.iterdir())
    resumed = _cli("generate", *SMALL, "--out", "run", "--resume")
    assert resumed.exit_code == 0, resumed.output
    after = log.read_text()  # the resumed session's lines come after the first's
    assert after.startswith(stopped_log) and CHATTER in after.removeprefix(stopped_log)


# --- item 7: a run is self-describing -----------------------------------------------------------------


def test_a_run_made_with_a_task_file_is_read_anywhere_without_it(tmp_path, monkeypatch):
    """The manifest records the task itself, not the path as typed: evaluate, report and publish
    work from another folder, and after the task file is gone."""
    use_fake_backends(monkeypatch)
    monkeypatch.setattr("wasp_vllm.evaluation.runner._make_embedder", lambda spec: HashEmbedderForTests())
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES, work)
    monkeypatch.chdir(work)
    made = _cli("generate", "--task", "tickets.toml", "--private", "tickets.csv", "--plms", "a,b",
                "--n", "12", "--rounds", "2", "--s", "2", "--label-check", "off", "--out", "run")  # fmt: skip
    assert made.exit_code == 0, made.output
    manifest = json.loads((work / "run" / "manifest.json").read_text())
    assert manifest["config"]["task"] == "tickets"  # its name, not the path as typed
    assert manifest["task_spec"] == get_task("tickets.toml").model_dump(mode="json")
    (work / "tickets.toml").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scored = _cli(
        "evaluate", "--synthetic", "../work/run/synthetic.parquet", "--test", "../work/tickets-test.csv"
    )
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.stdout)["task"] == "tickets"
    drawn = _cli("report", "../work/run", "--out", "page")
    assert drawn.exit_code == 0, drawn.output
    assert "feature_request" in (elsewhere / "page" / "index.html").read_text()
    shared = _cli("publish", "../work/run", "shared")
    assert shared.exit_code == 0, shared.output
    assert "feature_request" in (elsewhere / "shared" / "README.md").read_text()


# --- item 8: the Python API does what its page says --------------------------------------------------

API = dict(plms=["a", "b"], n=36, rounds=3, q=2, s=2)
LABELS = ["positive", "neutral", "negative"]


def test_plan_takes_out_and_warns_where_the_run_would_stop(tmp_path, caplog):
    done = tmp_path / "done"
    done.mkdir()
    (done / "manifest.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="wasp_vllm"):
        wasp_vllm.plan(plms=["smollm2"], out=done)  # it raised "unknown setting 'out'"
    assert "already holds a run" in caplog.text and "the run would stop there" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wasp_vllm"):
        wasp_vllm.plan(plms=["smollm2"], out=done, resume=True)
        wasp_vllm.plan(plms=["smollm2"], out=tmp_path / "new")
    assert "would stop" not in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done"] and list(done.iterdir()) == [
        done / "manifest.json"
    ]
    with pytest.raises(ValueError, match="exclude each other"):
        wasp_vllm.plan(plms=["smollm2"], out=done, resume=True, overwrite=True)


def _test_frame(n: int = 30) -> pd.DataFrame:
    return pd.DataFrame({"review": private_texts(n, seed=5), "rating": [LABELS[i % 3] for i in range(n)]})


def test_evaluate_takes_in_memory_test_data_and_never_prints_it(tmp_path, monkeypatch, caplog, capsys):
    use_fake_backends(monkeypatch)
    result = wasp_vllm.generate(out=tmp_path / "run", **API)
    frame, embedder = _test_frame(), HashEmbedderForTests()
    keyed = dict(text_col="review", label_col="rating", embedder=embedder)
    scores = [
        wasp_vllm.evaluate(result, test=test, **keyed)
        for test in (frame, frame.to_dict("records"), pa.Table.from_pandas(frame))
    ]
    assert {s.classifier.n_test for s in scores} == {30} and len({s.classifier.accuracy for s in scores}) == 1
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ValueError) as refused:
            wasp_vllm.evaluate(result, test=frame, embedder=embedder)  # its columns are review, rating
        with pytest.raises(ValueError) as odd:
            wasp_vllm.evaluate(result, test=42, embedder=embedder)
    for exc in (refused.value, odd.value):
        assert len(str(exc).splitlines()) == 1
    assert "no text column 'text'" in str(refused.value) and "test data of type int" in str(odd.value)
    said = str(refused.value) + caplog.text + "".join(capsys.readouterr())
    assert not any(text.split()[1] in said for text in frame["review"])  # not one record's words


CHATTY_API_RUN = """
import logging, sys
import pytest
from tests.fakes import use_fake_backends
from tests.test_first_hour import ChattyEngineForUnitTests
import wasp_vllm

class LoudEngineForUnitTests(ChattyEngineForUnitTests):
    def generate(self, prompts, seeds, params):
        logging.getLogger("vllm").warning("vllm start-up line, as its logger writes it")
        return super().generate(prompts, seeds, params)

logging.basicConfig(level=logging.INFO)
use_fake_backends(pytest.MonkeyPatch(), {p: LoudEngineForUnitTests(p) for p in "ab"})
wasp_vllm.generate(out=sys.argv[1], plms=["a", "b"], n=36, rounds=3, q=2, s=2)
"""


def test_generate_from_python_keeps_engine_logs_off_the_console_and_sums_up(tmp_path):
    """A script with logging at INFO: the engines' chatter goes to the run's engine log, wasp_vllm's
    lines stay on the console, the last of them one line that sums the run up."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WASP_VLLM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", CHATTY_API_RUN, str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert CHATTER not in console and "vllm start-up line" not in console
    assert "round 2: 12 samples" in console  # wasp_vllm's own lines are still there
    last = console.strip().splitlines()[-1]
    assert "36 samples written to" in last and "epsilon spent 4.000 of 4" in last, last
    assert CHATTER in (tmp_path / "run" / "private" / "engines.log").read_text()


def test_the_engine_log_gives_the_libraries_their_levels_back(tmp_path):
    """A library imported during the run sets its own level (torch: its at-exit INFO lines stay
    quiet); one left alone is as the user had it."""
    from wasp_vllm.engines import engine_messages

    torch_log, faiss_log = logging.getLogger("torch"), logging.getLogger("faiss")
    before = torch_log.level, faiss_log.level
    try:
        torch_log.setLevel(logging.NOTSET)
        faiss_log.setLevel(logging.INFO)
        with engine_messages(tmp_path / "engines.log"):
            assert faiss_log.level == logging.ERROR
            torch_log.setLevel(logging.WARNING)  # what importing torch does
        assert (torch_log.level, faiss_log.level) == (logging.WARNING, logging.INFO)
    finally:
        torch_log.setLevel(before[0])
        faiss_log.setLevel(before[1])


# --- item 9: messages a newcomer needs ------------------------------------------------------------------


class CtrlCInRoundForUnitTests(DiesInRoundForTests):
    """FAKE engine for unit tests: the user presses Ctrl-C at its first call once the rounds before
    ``round_index`` are committed."""

    def generate(self, prompts, seeds, params):
        if self.last_committed.exists():
            raise KeyboardInterrupt
        return FakeEngineForUnitTests.generate(self, prompts, seeds, params)


def test_ctrl_c_says_in_which_round_the_run_stopped_and_how_to_go_on(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    use_fake_backends(monkeypatch, {"a": CtrlCInRoundForUnitTests(tmp_path / "api", 2, "a")})
    with caplog.at_level(logging.INFO, logger="wasp_vllm"), pytest.raises(KeyboardInterrupt):
        wasp_vllm.generate(out=tmp_path / "api", **API)
    assert "stopped in round 3 of 3; `--resume` (resume=True) continues it" in caplog.text
    # (the command line sets up its logging anew: caplog sees nothing after it)
    use_fake_backends(monkeypatch, {"a": CtrlCInRoundForUnitTests(tmp_path / "run", 1, "a")})
    stopped = _cli("generate", *SMALL, "--out", "run")
    assert stopped.exit_code != 0
    assert "stopped in round 2 of 3; `--resume` (resume=True) continues it" in " ".join(
        stopped.output.split()
    )


def test_the_summary_counts_the_samples_cut_at_the_token_cap(tmp_path, monkeypatch, caplog):
    """The fake engine writes 12 tokens a sample: at a cap of 12 every sample hit it."""
    use_fake_backends(monkeypatch)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="wasp_vllm"):
        wasp_vllm.generate(out=tmp_path / "api", max_new_tokens=12, **API)
    summary = [r.getMessage() for r in caplog.records if "samples written to" in r.getMessage()]
    assert len(summary) == 1 and "36 of 36 samples hit the 12-token cap" in summary[0]
    capped = _cli("generate", *SMALL, "--max-new-tokens", "12", "--out", "capped")
    assert capped.exit_code == 0, capped.output
    said = " ".join(capped.output.split())
    assert "36 of 36 samples hit the 12-token cap" in said and "a likely cause of poor data" in said
    work = json.loads((tmp_path / "capped" / "manifest.json").read_text())["work"]
    assert sum(w["capped"] for w in work.values()) == 36
    roomy = _cli("generate", *SMALL, "--max-new-tokens", "13", "--out", "roomy")
    assert roomy.exit_code == 0 and "token cap" not in roomy.output


def test_tasks_check_shows_a_prompt_of_each_kind():
    checked = _cli("tasks", "--check", str(EXAMPLES / "tickets.toml"))
    assert checked.exit_code == 0, checked.output
    for kind in ("zero_shot", "few_shot", "contrastive"):
        assert f"{kind} prompt (" in checked.output
    lines = checked.output.splitlines()
    assert 'A customer-support ticket that is a bug report: "' in lines  # whole, as the PLM reads it
    assert (
        'Another customer-support ticket that is a bug report, worded differently from the ones above: "'
        in lines
    )
    assert 'A bad ticket: "<a synthetic text the votes turned from>"' in lines


def test_the_first_run_page_shows_stop_and_max_new_tokens_as_a_task_file_holds_them():
    """docs/first-run.md's snippet of the two keys is valid TOML and states their defaults."""
    import tomllib

    from wasp_vllm.tasks import TaskSpec

    page = (ROOT / "docs" / "first-run.md").read_text()
    snippet = next(b for b in page.split("```toml")[1:] if "max_new_tokens" in b.split("```")[0])
    keys = tomllib.loads(snippet.split("```")[0])
    assert keys == {"stop": TaskSpec.model_fields["stop"].default_factory(), "max_new_tokens": 128}
    assert TaskSpec.model_fields["max_new_tokens"].default == 128
    assert "publish` copies" in page and "leaves `report/` out" in page
    assert "label check" in page.split("How to word `label_descriptions`")[1][:400]


# --- item 10: tables that fit the terminal -------------------------------------------------------------


def test_the_dry_run_s_engines_read_whole_on_an_80_column_terminal(monkeypatch):
    """At 80 columns the engine table's ten columns wrapped into six-character ones ("buil t-in
    tabl e"); there it is one entry per PLM, and the table where it fits."""
    monkeypatch.setattr("wasp_vllm.pipeline.estimate.nvidia_gpus", lambda: [])
    argv = ["generate", "--plms", "smollm2,gemma3", "--n", "60", "--dry-run"]
    engines = wasp_vllm.plan(plms=["smollm2", "gemma3"], n=60).engines
    narrow = CliRunner().invoke(app, argv, env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert max(len(line) for line in narrow.output.splitlines()) <= 80
    said = " ".join(narrow.output.split())
    for e in engines:
        assert f"{e.plm} ({e.engine}, {e.resolves}): {e.samples} samples, {e.generated} generated" in said
        assert f"{e.tokens:,} tokens at {e.tokens_per_s:.0f} tok/s" in said and f"from {e.source}" in said
    wide = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert wide.exit_code == 0 and "┃ PLM " in wide.output and engines[0].source in wide.output


@pytest.fixture(autouse=True)
def _scratch_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WASP_VLLM_CACHE", str(tmp_path / "cache"))
