"""Issue 60, item 8: a newcomer's first hour, in CI.

The commands of ``docs/first-run.md`` (between its ``newcomer-test`` markers) run as written, as a
user runs them: ``wasp-vllm`` as a real process, in a fresh folder holding a copy of exactly the
files of ``docs/examples/`` (a custom task file, a made-up csv of support tickets and a test csv).
``generate`` (tiny: SmolLM2 on vLLM, N=12) -> ``evaluate`` -> ``report`` -> ``publish``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from wasp_vllm.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "first-run.md"


def documented_commands() -> list[list[str]]:
    """The ``wasp-vllm`` command lines of the page's marked block, split as a shell would."""
    block = re.search(r"<!-- newcomer-test:begin -->(.*?)<!-- newcomer-test:end -->", DOC.read_text(), re.S)
    assert block, "docs/first-run.md lost its newcomer-test markers"
    lines = [line.strip() for line in block.group(1).splitlines() if line.strip().startswith("wasp-vllm ")]
    return [shlex.split(line) for line in lines]


def test_the_page_shows_the_four_steps_on_the_example_files():
    """Cheap, in every test run: the slow test below runs what the page shows."""
    commands = documented_commands()
    assert [c[1] for c in commands] == ["generate", "evaluate", "report", "publish"]
    named = {Path(arg) for c in commands for arg in c if arg.startswith("docs/examples/")}
    assert named and all((ROOT / path).is_file() for path in named)
    assert get_task(str(ROOT / "docs/examples/tickets.toml")).labels == ["bug", "billing", "feature_request"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_newcomer_runs_the_documented_commands(tmp_path):
    pytest.importorskip("vllm")
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outputs = []
    for argv in documented_commands():
        proc = subprocess.run(
            [sys.executable, "-m", "wasp_vllm", *argv[1:]], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=800,
        )  # fmt: skip
        assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stderr[-3000:]}"
        outputs.append(proc)
    run, published = tmp_path / "runs" / "tickets", tmp_path / "published" / "tickets"
    rows = pq.read_table(run / "synthetic.parquet")
    assert rows.num_rows == 12  # exactly N
    assert set(rows.column("label").to_pylist()) <= {"bug", "billing", "feature_request"}
    scores = json.loads(outputs[1].stdout)
    assert 0.0 <= scores["accuracy"] <= 1.0
    assert (run / "report" / "index.html").is_file()
    assert {p.name for p in published.iterdir()} >= {"synthetic.parquet", "manifest.json", "README.md"}
    assert not (published / "private").exists()
