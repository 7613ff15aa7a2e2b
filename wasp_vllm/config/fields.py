"""The machinery of every settings model: a field with its help and panel, roles, readable errors.

A settings model (the run's roles, ``evaluate``'s, ``hotpate``'s) declares each field with
:func:`setting`; ``cli/options.py`` makes one command-line option per field from it, and
:func:`build_settings` turns pydantic's errors into one line per wrong setting.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SettingsT = TypeVar("SettingsT", bound=BaseModel)


class ConfigError(ValueError):
    """A run configuration that cannot work; the message says which setting and why."""


def setting(
    default: Any,
    help: str,
    panel: str | None = None,
    *,
    flag: str | None = None,
    hidden: bool = False,
    **constraints: Any,
) -> Any:
    """A field of a settings model: its default, its help text and where ``--help`` shows it (a
    :class:`Role`'s fields take the role's panel); ``hidden``: a test setting, kept out of ``--help``."""
    extra = {"panel": panel, "flag": flag, "hidden": hidden}
    return Field(default, description=help, json_schema_extra=extra, **constraints)  # type: ignore[arg-type]


class Role(BaseModel):
    """The settings of one role of a run; ``--help`` shows its fields under its ``panel``.

    :class:`RunConfig` is composed of the roles; each part of a run receives its own role's value
    (``cfg.privacy``, ``cfg.engines``, ...) rather than the whole configuration.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    panel: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for field in cls.model_fields.values():
            extra = field.json_schema_extra
            if isinstance(extra, dict) and extra.get("panel") is None and cls.panel:
                extra["panel"] = cls.panel

    @classmethod
    def of(cls: type[RoleT], cfg: BaseModel) -> RoleT:
        """This role's settings read from a composed configuration (already validated there)."""
        return cls.model_construct(**{name: getattr(cfg, name) for name in cls.model_fields})


RoleT = TypeVar("RoleT", bound=Role)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or YAML run file into a plain dict (validation happens in RunConfig)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {path} must end in .toml, .yaml or .yml")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - parser errors of either format
        raise ConfigError(f"config file {path} could not be parsed: {_where(exc, text)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of settings")
    return data


def _where(exc: Exception, text: str) -> str:
    """A parser error as 'what at line L, column C' (1-based, as an editor counts)."""
    mark = getattr(exc, "problem_mark", None)  # yaml.MarkedYAMLError
    if mark is not None:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    lineno, colno = getattr(exc, "lineno", None), getattr(exc, "colno", None)  # tomllib (3.14), json
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if lineno is not None and colno is not None and "line" not in message:
        return f"{message} at line {lineno}, column {colno}"
    if "(at end of document)" in message:  # tomllib: an unclosed array, table or string
        last = text.rstrip("\n").splitlines() or [""]
        where = f"(at the end of the file: line {len(last)}, column {len(last[-1]) + 1})"
        return message.replace("(at end of document)", where)
    return message  # tomllib before 3.14 ends its message in "(at line L, column C)"


def build_settings(model: type[SettingsT], values: dict[str, Any]) -> SettingsT:
    """A settings value from plain values, or a ConfigError naming each wrong setting."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(err, model) for err in exc.errors())) from None


def _describe(err: Any, model: type[BaseModel]) -> str:
    """One pydantic error as ``setting: problem``; the offending value is not repeated."""
    where = ".".join(str(p) for p in err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][0]), model.model_fields, n=1)
        return f"unknown setting {where!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    if err["type"] == "missing":
        return f"{where} is required"
    message = err["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if err["loc"] else message
