"""Every setting is spelled once: the ``generate`` options are the config model's fields."""

from __future__ import annotations

import typer.main
from typer.testing import CliRunner

from wasp_vllm.cli import app
from wasp_vllm.config import RunConfig


def _options() -> dict[str, object]:
    command = typer.main.get_command(app).commands["generate"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_every_config_field_is_an_option_with_its_help_and_default():
    options = _options()
    for name, field in RunConfig.model_fields.items():
        assert name in options, f"setting {name} has no command-line option"
        option = options[name]
        assert option.default is None  # not given: the run file or the model's default decides
        assert field.description and field.description.split(".")[0] in option.help
        default = field.get_default(call_default_factory=True)
        if default is not None:
            shown = ",".join(default) if isinstance(default, list) else str(default)
            assert f"(default: {shown})" in option.help, name
        flag = (field.json_schema_extra or {}).get("flag") or "--" + name.replace("_", "-")
        assert flag in option.opts, name


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
