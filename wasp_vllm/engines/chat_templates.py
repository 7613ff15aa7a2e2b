"""The chat templates shipped for the chat presets, rendered without a tokenizer.

A chat model's own template comes with its tokenizer; these short public Jinja texts (one per
model family, in ``engines/templates/``) stand in where a tokenizer has none, show a user how a
task prompt reaches a model (``wasp-vllm models --show-prompt NAME``), and let the tests check the
role markers of every preset on a machine that cannot download a tokenizer.  They are rendered the
way ``transformers`` renders chat templates (a sandboxed Jinja environment, ``trim_blocks`` and
``lstrip_blocks``, ``raise_exception``).
"""

from __future__ import annotations

import contextlib
from functools import cache
from importlib import resources
from typing import Any

from wasp_vllm.engines.presets import PRESETS


class TemplateError(ValueError):
    """A template that does not exist or refuses the messages it is given."""


@cache
def template_text(name: str) -> str:
    """The Jinja text of the shipped template ``name`` (e.g. ``llama3``)."""
    path = resources.files("wasp_vllm.engines").joinpath("templates", f"{name}.jinja")
    if not path.is_file():
        raise TemplateError(f"no shipped chat template {name!r}")
    return path.read_text(encoding="utf-8")


def preset_template(plm: str) -> str | None:
    """The shipped template text of a chat preset, or None (a base model, a path, an unknown name)."""
    preset = PRESETS.get(plm)
    return template_text(preset.template) if preset and preset.chat and preset.template else None


def render_chat(template: str, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Render chat ``messages`` with the Jinja ``template`` text, as ``apply_chat_template`` does."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        page = env.from_string(template)
        return page.render(messages=messages, add_generation_prompt=add_generation_prompt)
    except JinjaError as exc:
        raise TemplateError(f"chat template failed: {exc}") from None


class TemplateTokenizer:
    """Just enough of a tokenizer for :func:`wasp_vllm.engines.base.chat_prompt`: its template."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = True
    ) -> str:
        del tokenize  # text only: there is no vocabulary here
        return render_chat(self.chat_template, messages, add_generation_prompt)


def ensure_chat_template(tokenizer: Any, plm: str) -> Any:
    """Give a chat preset's tokenizer the shipped template when its model came without one."""
    fallback = preset_template(plm)
    if fallback is not None and not getattr(tokenizer, "chat_template", None):
        # A tokenizer that will not take one keeps its own way.
        with contextlib.suppress(AttributeError, TypeError):
            tokenizer.chat_template = fallback
    return tokenizer
