"""Command-line options made from the config model: each setting's name, help and default once.

:func:`config_command` turns a function ``f(settings: dict, **command_options)`` into a Typer
command with one option per :class:`~wasp_vllm.config.RunConfig` field (``--max-new-tokens``
for ``max_new_tokens``, or the field's own ``flag``), grouped in ``--help`` by the field's panel.
Every option defaults to "not given" (None), so a run file (``--config``) fills what the command
line leaves out and the model's default fills the rest.  Choices and bounds are checked by the
model, which gives one ``error:`` line naming the setting.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import typer
from pydantic.fields import FieldInfo

from wasp_vllm.config import RunConfig


def _cli_type(annotation: Any) -> tuple[type, list[str]]:
    """The type Typer parses (lists and choices arrive as text) and the choices, if any."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return str, [str(v) for v in typing.get_args(annotation)]
    if typing.get_origin(annotation) is list:
        return str, []
    return annotation, []


def _help(field: FieldInfo, choices: list[str]) -> str:
    default = field.get_default(call_default_factory=True)
    shown = ",".join(default) if isinstance(default, list) else default
    text = field.description or ""
    if choices and "'" not in text:
        text += f" One of: {', '.join(choices)}."
    return f"{text} (default: {shown})" if default is not None else text


def config_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per config field, annotated with its Typer option."""
    params = []
    for name, field in RunConfig.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        cli_type, choices = _cli_type(field.annotation)
        decls = [str(extra["flag"])] if extra.get("flag") else []
        option = typer.Option(
            *decls, help=_help(field, choices), rich_help_panel=str(extra.get("panel")), show_default=False
        )
        annotation = Annotated[cli_type | None, option]  # type: ignore[valid-type]
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        )
    return params


def config_command(command: Callable[..., None]) -> Callable[..., None]:
    """``command(settings, **own_options)`` as a Typer callback taking every config option too.

    ``command``'s own keyword parameters (``--config``, ``--out``, ...) keep their annotations;
    the config options are collected into ``settings`` (only those given on the command line).
    """
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in list(inspect.signature(command, eval_str=True).parameters.values())[1:]
    ]
    fields = set(RunConfig.model_fields)

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        settings = {k: v for k, v in kwargs.items() if k in fields and v is not None}
        command(settings, **{k: v for k, v in kwargs.items() if k not in fields})

    params = [*config_parameters(), *own]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # Typer must read the new signature, not the wrapped one
    return wrapper
