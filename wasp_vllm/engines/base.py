"""The one small interface every generation backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from wasp_vllm.config import SamplingSettings


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings shared by all engines."""

    max_new_tokens: int = 64
    # Base models often open with a blank line or a closing quote; a few forced tokens
    # keep a stop string from ending the sample before it starts.
    min_new_tokens: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 50  # 0 = off
    stop: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_settings(
        cls,
        sampling: SamplingSettings,
        *,
        task_cap: int | None = None,
        stop: tuple[str, ...] = (),
    ) -> GenerationParams:
        """A run's sampling: its settings, with the task's token cap where the run sets none."""
        return cls(
            max_new_tokens=sampling.max_new_tokens or task_cap or cls.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop=stop,
        )


@dataclass(frozen=True)
class Completion:
    """One generated sample and the number of tokens it cost."""

    text: str
    n_tokens: int


class Engine(Protocol):
    """Prompts in, texts out, one seed per request."""

    name: str

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], params: GenerationParams
    ) -> list[Completion]: ...

    def close(self) -> None: ...


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut ``text`` at the first stop string (engines may overshoot by a token)."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def split_answer_prefill(prompt: str) -> tuple[str, str]:
    """A task prompt's trailing opening quote, split off to start the assistant's answer."""
    if prompt.endswith('"'):
        return prompt[:-1].rstrip(), '"'
    return prompt, ""


def chat_prompt(tokenizer: object, prompt: str) -> str:
    """Wrap a task prompt for a chat model.

    Task prompts end with an opening quote so that a base model's continuation is
    the sample itself. A chat model would answer the quote conversationally, so the
    quote moves into the start of the assistant's turn instead (a prefill).
    """
    prompt, prefill = split_answer_prefill(prompt)
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
    return text + prefill
