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
        if isinstance(default, BaseModel):  # a table (engine arguments): each key's default, shown once
            for key, value in default.model_dump().items():
                assert f"{key} ({'auto' if value is None else str(value).lower()})" in option.help, key
            continue
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
    run = {"config": {"task": "drugs", "private_limit": 30, "seed": 4}}  # the run's task, M and seed
    (tmp_path / "manifest.json").write_text(json.dumps(run))
    args = ["evaluate", "--synthetic", str(tmp_path / "s.parquet"), "--test", "drugs", "--m", "7",
            "--task-model", "logreg", "--reference", "drugs:fit",
            "--reference-public"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    # --m given wins over the run's M; the run's seed and task fill what was not given
    assert seen == EvalSettings(test="drugs", task="drugs", private_limit=7, seed=4, reference="drugs:fit",
                                reference_public=True).model_dump()  # fmt: skip
    without_m = [a for a in args if a not in ("--m", "7")]
    assert CliRunner().invoke(app, without_m).exit_code == 2 and seen["private_limit"] == 30
    bad = CliRunner().invoke(app, [*args[:5], "--task-model", "svm"])
    assert bad.exit_code == 2 and "model" in bad.output and "logreg" in bad.output


def test_options_reach_the_config(monkeypatch, tmp_path):
    seen = {}

    def stop(file_values, overrides):
        seen.update(overrides)
        raise ValueError("stop here")

    monkeypatch.setattr("wasp_vllm.api.build_config", stop)
    args = ["generate", "--m", "7", "--n", "12", "--plms", "a,b", "--strategy", "aug-pe", "--engine-arg",
            "sleep_mode=false", "--engine-arg", "batch_size = 16", "--out", str(tmp_path / "o")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen == {"private_limit": 7, "n": 12, "plms": "a,b", "strategy": "aug-pe",
                    "engine_args": ["sleep_mode=false", "batch_size = 16"]}  # fmt: skip
    cfg = RunConfig(**{**seen, "strategy": "wasp"})
    assert cfg.plms == ["a", "b"] and cfg.engine_args.batch_size == 16 and cfg.engine_args.sleep_mode is False


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--engine-arg", "batch_size"], "--engine-arg 'batch_size': write KEY=VALUE"),
        (["--engine-arg", "batch_sise=16"], "engine_args.batch_sise"),
        (["--engine-arg", "batch_size=many"], "engine_args.batch_size"),
        (["--batch-size", "16"], "No such option"),
    ],
)
def test_an_engine_argument_that_is_not_one_is_one_error_line(argv, why, tmp_path):
    result = CliRunner().invoke(app, ["generate", *argv, "--out", str(tmp_path / "o"), "--dry-run"])
    assert result.exit_code == 2 and why in result.output, result.output
    assert "Traceback" not in result.output


def test_a_run_file_that_sets_a_moved_engine_setting_is_told_where_it_went(tmp_path):
    from wasp_vllm.config import ConfigError, build_config, read_config_file

    old = tmp_path / "old.toml"
    old.write_text("n = 36\nbatch_size = 16\nsleep_mode = true\n")
    with pytest.raises(
        ConfigError, match="batch_size, sleep_mode: now an engine argument: --engine-arg batch"
    ):
        build_config(read_config_file(old), {})
    new = tmp_path / "new.toml"
    new.write_text("n = 36\n[engine_args]\nbatch_size = 16\n")
    assert build_config(read_config_file(new), {}).engine_args.batch_size == 16


def test_test_only_settings_are_hidden_from_help_and_still_work(tmp_path):
    shown = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output
    assert "--noise-seed" not in shown and "--dirichlet" not in shown and "--engine-arg" in shown
    options = [line for line in shown.splitlines() if line.lstrip("│ ").startswith("--")]
    assert len(options) <= 46, len(options)  # 56 before issue 74; --publish-better (issue 76) since
    result = CliRunner().invoke(app, ["generate", "--noise-seed", "3", "--out", str(tmp_path / "o"),
                                      "--dry-run"])  # fmt: skip
    assert result.exit_code == 0, result.output


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
