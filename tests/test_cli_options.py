"""Every setting is spelled once: a command's options are its settings model's fields (``generate``:
RunConfig; ``audit``: the RunConfig fields an audit needs; ``privacy``: the RunConfig fields that
decide sigma; ``evaluate``: EvalSettings; ``hotpate``: HotPateOptions; ``report``: ReportSettings;
``publish``: PublishSettings), with the model's help and default."""

from __future__ import annotations

import enum
import json

import pytest
import typer.main
from pydantic import BaseModel
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.testing import CliRunner

from wasp_vllm.cli import app
from wasp_vllm.cli.audit import AUDIT_SETTINGS
from wasp_vllm.cli.commands import PRIVACY_SETTINGS
from wasp_vllm.config import RunConfig
from wasp_vllm.evaluation.settings import EvalSettings
from wasp_vllm.hotpate.options import HotPateOptions
from wasp_vllm.publish.settings import PublishSettings
from wasp_vllm.report.settings import ReportSettings

#: The options a command has beside its settings' (where it writes, how it treats what is there).
OWN_OPTIONS = {
    "generate": {"config", "out", "resume", "overwrite", "dry_run", "verbose"},
    "audit": {"config", "out", "canaries", "out_guesses", "confidence", "overwrite", "allow_weak"},
    "privacy": set(),
    "evaluate": {"synthetic", "out"},
    "hotpate": {"out", "overwrite"},
    "report": {"run_dir", "out"},
    "publish": {"run_dir", "dest", "overwrite"},
}


def _options(command: str = "generate") -> dict[str, TyperOption | TyperArgument]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)  # the app has several commands
    # every parameter of a Typer command is a TyperOption or a TyperArgument (the ones with help)
    return {p.name: p for p in group.commands[command].params if isinstance(p, TyperOption | TyperArgument)}


@pytest.mark.parametrize(
    ("command", "model", "fields"),
    [
        ("generate", RunConfig, None),
        ("audit", RunConfig, AUDIT_SETTINGS),  # what an audit needs; the rest from --config
        ("privacy", RunConfig, PRIVACY_SETTINGS),
        ("evaluate", EvalSettings, None),
        ("hotpate", HotPateOptions, None),
        ("report", ReportSettings, None),
        ("publish", PublishSettings, None),
    ],
)
def test_every_settings_field_is_an_option_with_its_help_and_default(command, model: type[BaseModel], fields):
    options = _options(command)
    chosen = {n: f for n, f in model.model_fields.items() if fields is None or n in fields}
    assert fields is None or set(chosen) == set(fields)
    assert set(options) == set(chosen) | OWN_OPTIONS[command], "an option spelled by hand"
    for name, field in chosen.items():
        assert name in options, f"setting {name} has no command-line option"
        option = options[name]
        assert option.help is not None, f"option {name} has no help"
        assert field.description and field.description.split(".")[0] in option.help
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        flag = extra.get("flag") or "--" + name.replace("_", "-")
        assert isinstance(flag, str), name
        assert flag.split("/")[0] in option.opts, name
        if field.is_required():
            assert option.required, name
            continue
        assert option.default is None  # not given: the run file or the model's default decides
        default = field.get_default(call_default_factory=True)
        if default is not None:  # the CLI's default is the model's, shown once
            default = default.value if isinstance(default, enum.Enum) else default
            shown = ",".join(default) if isinstance(default, list) else str(default)
            assert f"(default: {shown})" in option.help, name


def test_options_beside_the_settings_take_their_defaults_from_where_they_are_used():
    from wasp_vllm.ops.audit import CanaryDesign

    audit, design = _options("audit"), CanaryDesign()
    assert {n: audit[n].default for n in ("canaries", "out_guesses", "confidence")} == vars(design)
    assert _options("models")["task"].default == RunConfig.model_fields["task"].default


def test_evaluate_options_reach_its_settings(monkeypatch, tmp_path):
    seen = {}

    def stop(path, settings, **_):
        seen.update(settings.model_dump())
        raise ValueError("stop here")

    monkeypatch.setattr("wasp_vllm.evaluation.evaluate_synthetic", stop)
    (tmp_path / "s.parquet").write_bytes(b"")  # only its existence is checked before `stop`
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"task": "drugs"}}))  # the run's task
    args = ["evaluate", "--synthetic", str(tmp_path / "s.parquet"), "--test", "drugs", "--m", "7",
            "--model", "logreg", "--reference", "drugs:fit",
            "--reference-public"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen == EvalSettings(test="drugs", private_limit=7, reference="drugs:fit",
                                reference_public=True).model_dump()  # fmt: skip
    bad = CliRunner().invoke(app, [*args[:5], "--model", "svm"])
    assert bad.exit_code == 2 and "model" in bad.output and "logreg" in bad.output


def test_options_reach_the_config(monkeypatch, tmp_path):
    seen = {}

    def stop(file_values, overrides):
        seen.update(overrides)
        raise ValueError("stop here")

    monkeypatch.setattr("wasp_vllm.api.build_config", stop)
    args = ["generate", "--m", "7", "--n", "12", "--plms", "a,b", "--strategy", "aug-pe", "--no-sleep-mode",
            "--out", str(tmp_path / "o")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen == {"private_limit": 7, "n": 12, "plms": "a,b", "strategy": "aug-pe", "sleep_mode": False}
    assert RunConfig(**{**seen, "strategy": "wasp"}).plms == ["a", "b"]  # the model splits the list


def test_the_run_settings_are_one_value_per_role_and_each_help_panel_is_its_role():
    from wasp_vllm.config import (
        DataSettings,
        EngineSettings,
        MethodSettings,
        PrivacySettings,
        SamplingSettings,
        WhatSettings,
    )

    roles = (WhatSettings, DataSettings, PrivacySettings, MethodSettings, SamplingSettings, EngineSettings)
    owned = [name for role in roles for name in role.model_fields]
    assert sorted(owned) == sorted(RunConfig.model_fields), "each setting belongs to exactly one role"
    options = _options("generate")
    for role in roles:
        assert role.panel, role
        for name in role.model_fields:
            assert options[name].rich_help_panel == role.panel, name
    # --help reads in the roles' order, and each role's value holds what the run was given
    panels = list(dict.fromkeys(options[n].rich_help_panel for n in RunConfig.model_fields))
    assert panels == [role.panel for role in roles]
    cfg = RunConfig(epsilon=2.0, seed=7, engine="hf", plms="smollm2", q=3)
    assert (cfg.privacy.epsilon, cfg.sampling.seed, cfg.engines.engine, cfg.what.plms, cfg.method.q) == (
        2.0, 7, "hf", ["smollm2"], 3,
    )  # fmt: skip
    assert cfg.privacy == PrivacySettings(epsilon=2.0)
    assert cfg.data == DataSettings()


def _commands(group: TyperGroup, prefix: str = "") -> dict[str, object]:
    """Every command and sub-command of ``group``, by its full name."""
    found: dict[str, object] = {}
    for name, command in group.commands.items():
        found[prefix + name] = command
        if isinstance(command, TyperGroup):
            found |= _commands(command, f"{prefix}{name} ")
    return found


def test_every_command_sums_itself_up_in_one_line_of_the_command_list():
    """`wasp-vllm --help` lists each command by its help's first paragraph, keeping its line breaks:
    a summary written over several lines reads as ragged lines there."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    commands = _commands(group)
    assert {"generate", "audit", "models", "fleet up"} <= set(commands)
    for name, command in commands.items():
        summary = (getattr(command, "help", None) or "").strip().split("\n\n")[0]
        assert summary and "\n" not in summary, f"{name}: {summary!r}"
    listing = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"}).output
    assert "a lower bound on the epsilon a real run of them has" in " ".join(listing.split())
