"""Issue 60, item 7: the strategies table says WASP's later prompt as a default run uses it,
``privacy`` shows the sigma a default run adds, an epsilon above 10 is warned about, and a plan
says when the machine is busy."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from wasp_vllm.cli import app
from wasp_vllm.config import RunConfig
from wasp_vllm.config.checks import machine_load_note
from wasp_vllm.pipeline import privacy_plan

WIDE = {"COLUMNS": "250"}


def test_the_strategies_table_says_wasps_default_later_prompt():
    result = CliRunner().invoke(app, ["strategies"], env=WIDE)
    assert result.exit_code == 0
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert "few_shot (default" in rows["wasp"] and "contrastive" in rows["wasp"]
    assert "zero_shot" in rows["fusegen"] and "(default" not in rows["fusegen"]


def test_privacy_shows_the_sigma_a_default_run_uses():
    result = CliRunner().invoke(app, ["privacy"], env=WIDE)
    assert result.exit_code == 0, result.output
    sigma = privacy_plan(RunConfig()).sigma
    assert sigma is not None
    line = next(x for x in result.output.splitlines() if x.startswith("generate with these settings"))
    assert f"sigma {sigma:.3f}" in line and "replace (--m 100 draw)" in line
    assert "warning" not in result.output


@pytest.mark.parametrize("command", [["privacy"], ["generate", "--dry-run"]])
def test_an_epsilon_above_ten_is_warned_about(command):
    quiet = CliRunner().invoke(app, [*command, "--epsilon", "10"], env=WIDE)
    loud = CliRunner().invoke(app, [*command, "--epsilon", "20"], env=WIDE)
    assert quiet.exit_code == loud.exit_code == 0, loud.output
    assert "above 10" not in quiet.output
    assert "epsilon=20 is above 10: the guarantee then means little" in " ".join(loud.output.split())


def test_a_busy_machine_is_named_in_the_plan(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (0.4, 0.4, 0.4))
    assert machine_load_note() is None
    idle = CliRunner().invoke(app, ["generate", "--dry-run"], env=WIDE)
    monkeypatch.setattr("os.getloadavg", lambda: (7.0, 6.0, 5.0))
    note = machine_load_note()
    assert note is not None and "load 7.0 on 2 cores" in note and "4.0x as long" in note
    busy = CliRunner().invoke(app, ["generate", "--dry-run"], env=WIDE)
    assert "busy" not in idle.output and "this machine is busy (load 7.0 on 2 cores)" in busy.output
