"""Command-line options made from a settings model: each setting's name, help and default once.

:func:`settings_command` turns a function ``f(settings: dict, **command_options)`` into a Typer
command with one option per field of a settings model (``--max-new-tokens`` for
``max_new_tokens``, or the field's own ``flag``), grouped in ``--help`` by the field's panel:
``generate`` and ``audit`` from :class:`~wasp_vllm.config.RunConfig` (:func:`config_command`),
``evaluate`` from :class:`~wasp_vllm.evaluation.settings.EvalSettings`.  Every option defaults to
"not given" (None), so a run file (``--config``) fills what the command line leaves out and the
model's default fills the rest; a required field is a required option.  Choices and bounds are
checked by the model, which gives one ``error:`` line naming the setting.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
import typing
from collections.abc import Callable, Collection
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from wasp_vllm.config import RunConfig


def _cli_type(annotation: Any) -> tuple[type, list[str]]:
    """The type Typer parses (lists and choices arrive as text) and the choices, if any."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return str, [str(v) for v in typing.get_args(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return str, [str(v.value) for v in annotation]
    if typing.get_origin(annotation) is list:
        return str, []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list[str], []  # KEY=VALUE, repeatable: the model reads the pairs
    return annotation, []


def _help(field: FieldInfo, choices: list[str]) -> str:
    if field.is_required():
        return field.description or ""  # Typer adds [required]
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):  # a table of settings: its help lists its defaults
        return field.description or ""
    shown = ",".join(default) if isinstance(default, list) else default
    shown = default.value if isinstance(default, enum.Enum) else shown
    text = field.description or ""
    if choices and "'" not in text:
        text += f" One of: {', '.join(choices)}."
    return f"{text} (default: {shown})" if default is not None else text


def settings_parameters(
    model: type[BaseModel], fields: Collection[str] | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter per field of ``model`` (or of ``fields``), annotated with its Typer option."""
    params = []
    for name, field in model.model_fields.items():
        if fields is not None and name not in fields:
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        cli_type, choices = _cli_type(field.annotation)
        decls = [str(extra["flag"])] if extra.get("flag") else []
        option = typer.Option(
            *decls, help=_help(field, choices), rich_help_panel=str(extra.get("panel")), show_default=False,
            hidden=bool(extra.get("hidden")),
        )  # fmt: skip
        if field.is_required():
            annotation: Any = Annotated[cli_type, option]
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
            continue
        annotation = Annotated[cli_type | None, option]
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        )
    return params


def settings_command(
    model: type[BaseModel], fields: Collection[str] | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``command(settings, **own_options)`` as a Typer callback taking every option of ``model``
    (or only those of ``fields``: a command that needs a few of a model's settings).

    ``command``'s own keyword parameters (``--config``, ``--out``, ...) keep their annotations;
    the settings' options are collected into ``settings`` (only those given on the command line).
    """

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in list(inspect.signature(command, eval_str=True).parameters.values())[1:]
        ]
        names = set(model.model_fields if fields is None else fields)

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            settings = {k: v for k, v in kwargs.items() if k in names and v is not None}
            command(settings, **{k: v for k, v in kwargs.items() if k not in names})

        params = [*settings_parameters(model, fields), *own]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # Typer must read the new signature, not the wrapped one
        return wrapper

    return decorate


#: ``generate``'s (and ``audit``'s) options: one per RunConfig field.
config_command = settings_command(RunConfig)
