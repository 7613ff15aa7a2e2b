"""Issue 60, item 4: ``generate --dry-run`` checks what ``generate`` checks (one function,
``pipeline.context.check_run``, called by both), so a plan that prints is a run that starts.

Each case is given to both, through the real CLI: both must refuse it with exit code 2 and the same
one ``error:`` line.  The run side stops before any model loads (a tripwire on the engine factory
and the embedder); its PLMs are tiny fake model directories that resolve like real ones.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.test_cli_errors import _records, assert_refused, fake_model_dir, write_csv
from tests.test_cli_errors import no_model_loads as no_model_loads  # autouse: no model loads here either
from wasp_vllm.cli import app


@pytest.fixture()
def env(tmp_path):
    """Arguments of a run that would start: two PLMs that resolve (tiny fake model directories)."""
    private = write_csv(tmp_path / "private.csv", _records())
    a, b = fake_model_dir(tmp_path / "tiny-a"), fake_model_dir(tmp_path / "tiny-b")
    base = {"--plms": f"{a},{b}", "--task": "drugs", "--private": str(private), "--n": "36", "--rounds": "3",
            "--q": "2", "--s": "2", "--embedder": "minilm", "--out": str(tmp_path / "out")}  # fmt: skip
    return tmp_path, base, tmp_path / "out"


def _argv(base: dict[str, str], changes: dict[str, str]) -> list[str]:
    args = {**base, **{"--" + k.replace("_", "-"): v for k, v in changes.items()}}
    return ["generate", *[x for kv in args.items() for x in kv]]


CASES = [
    ("s-too-large", {"s": "50"}, "s=50 is larger than any pool can be"),
    ("s-names-the-fix", {"n": "12", "rounds": "2", "s": "8", "plms": "{a}"}, "use --s 2, or --n 48 or more"),
    ("m-below-q", {"m": "5", "q": "8", "n": "300"}, "--m 5 draws fewer records than q=8: use --m 8"),
    ("n-below-labels-x-plms", {"n": "5", "rounds": "1"}, "n=5 is too small"),
    ("rounds-above-n", {"rounds": "40"}, "n=36 is smaller than rounds=40"),
    (
        "all-missing-plms-named",
        {"plms": "llama2,vicuna,no-such-plm"},
        "3 PLMs cannot be used here: PLM 'llama2' needs",
    ),
    ("builtin-data-for-a-task-file", {"private": "drugs", "task": "{task}"}, "pass your own records"),
    ("builtin-data-for-another-task", {"private": "drugs", "task": "imdb"}, "not to task 'imdb'"),
    ("private-of-a-type-never-read", {"private": "records.txt"}, "records.txt: unknown file type .txt"),
]


@pytest.mark.parametrize(("case", "changes", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_dry_run_refuses_what_the_run_refuses(env, case, changes, expected):
    tmp, base, out = env
    task = tmp / "tickets.toml"
    task.write_text(_TASK)
    fill = {"a": base["--plms"].split(",")[0], "task": str(task)}
    changes = {k: v.format(**fill) for k, v in changes.items()}
    run = assert_refused(CliRunner().invoke(app, _argv(base, changes)), expected)
    dry = assert_refused(CliRunner().invoke(app, [*_argv(base, changes), "--dry-run"]), expected)
    assert dry == run
    assert not out.exists()


def test_several_setting_problems_are_named_together(env):
    _, base, _ = env
    line = assert_refused(
        CliRunner().invoke(app, [*_argv(base, {"n": "5", "rounds": "2", "m": "1", "s": "9"}), "--dry-run"]),
        "n=5 is too small",
    )
    assert "--m 1 draws fewer records than q=2" in line and "s=9 is larger" in line


def test_a_plan_that_prints_has_a_zero_exit(env):
    _, base, _ = env
    result = CliRunner().invoke(app, [*_argv(base, {}), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "estimated wall time" in result.output


_TASK = """
name = "tickets"
description = "support tickets"
labels = ["positive", "neutral", "negative"]

[templates]
zero_shot = "Write a ticket that is {label}: \\""
few_shot = "Tickets that are {label}:\\n{examples}\\nWrite another: \\""
contrastive = "Good: {good_examples}\\nBad: {bad_examples}\\nWrite a {label} one: \\""
"""


def test_the_default_s_follows_the_pools_a_small_run_will_have(env, tmp_path):
    """Issue 60, item 2: ``--n 12 --rounds 2`` without ``--s`` runs with the largest pool its sizes
    allow (3 labels: 2 per label), where the default 8 could not fill; a chosen --s is kept (and,
    if too large, refused with the value that fits)."""
    from wasp_vllm.api import run_config

    _, base, _ = env
    assert run_config(None, None, {"n": 12, "rounds": 2}).s == 2
    assert run_config(None, None, {"n": 300, "rounds": 5}).s == 8  # fits: the default stays
    assert run_config(None, None, {"n": 12, "rounds": 2, "s": 8}).s == 8  # chosen: kept
    chosen = tmp_path / "run.toml"
    chosen.write_text("s = 8\n")
    assert run_config(None, str(chosen), {"n": 12, "rounds": 2}).s == 8
    small = {k: v for k, v in base.items() if k != "--s"} | {"--n": "12", "--rounds": "2"}
    small["--plms"] = base["--plms"].split(",")[0]
    result = CliRunner().invoke(app, [*_argv(small, {}), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--s 2: the largest pool this run's sizes allow" in " ".join(result.output.split())
