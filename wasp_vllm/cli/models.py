"""``wasp-vllm models``: the PLM presets, what each needs, whether it resolves here, and its prompt."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wasp_vllm.cli.app import app, friendly_errors
from wasp_vllm.config import RunConfig
from wasp_vllm.engines.presets import PACKAGED, PRESETS, PLMPreset


@app.command()
def models(
    show_prompt: Annotated[
        str | None,
        typer.Option(
            help="Print how a task prompt reaches this preset (its chat template filled in), then stop."
        ),
    ] = None,
    task: Annotated[
        str, typer.Option(help="Task whose zero-shot prompt --show-prompt renders.")
    ] = RunConfig.model_fields["task"].default,
) -> None:
    """List the PLM presets: hub id, GPU memory, prompt format, sampling, and whether each is here.

    Here: in the local Hugging Face cache (nothing is downloaded or loaded). GPU memory: the
    weights in bf16."""
    with friendly_errors():
        if show_prompt is not None:
            typer.echo(rendered_prompt(show_prompt, task))
            return
        table = Table(title="PLM presets (or pass a model directory / name@endpoint to --plms)")
        for col in ("name", "hub id / model", "set", "prompt", "bf16", "sampling", "here"):
            table.add_column(col, overflow="fold")
        for preset in PRESETS.values():
            table.add_row(*(escape(cell) for cell in preset_row(preset)))
        Console().print(table)
        gated = ", ".join(p.name for p in PRESETS.values() if p.gated)
        Console().print(
            "GPU memory: the weights in bf16; vLLM adds the KV cache (give it 20-50 % more). Sampling: "
            "the model maker's, used where --temperature/--top-p/--top-k are not set. A preset marked "
            "'no' is not in the local Hugging Face cache: `hf download HUB_ID` on a machine with hub "
            f"access ({gated}: accept the licence on huggingface.co and `hf auth login` first).",
            highlight=False,
        )


def preset_row(preset: PLMPreset) -> list[str]:
    """One row of the table: name, model, set, prompt, memory, sampling, whether it resolves here."""
    if preset.seq2seq:
        prompt = "seq2seq (hf engine)"
    else:
        prompt = f"chat ({preset.template or 'own'})" if preset.chat else "base"
    sampling = " ".join(f"{k}={v}" for k, v in vars(preset.sampling).items() if v is not None) or "run's"
    model = preset.hf_id or preset.description
    memory = f"{preset.bf16_gib:g} GiB"
    return [preset.name, model, preset.group, prompt, memory, sampling, available(preset)]


def available(preset: PLMPreset) -> str:
    """'yes' when it resolves from the local HF cache (or is packaged), else 'no'; nothing loads."""
    from wasp_vllm.engines.registry import ModelError, resolve_plm

    if preset.group == PACKAGED:
        return "yes (packaged)"
    try:
        resolve_plm(preset.name)
    except ModelError:
        return "no"
    return "yes"


def rendered_prompt(name: str, task_name: str) -> str:
    """The task's zero-shot prompt for its first label, as the preset's engine would send it."""
    from wasp_vllm.engines.base import chat_prompt
    from wasp_vllm.engines.chat_templates import TemplateTokenizer, preset_template
    from wasp_vllm.engines.registry import ModelError
    from wasp_vllm.tasks import build_prompt, get_task

    preset = PRESETS.get(name)
    if preset is None:
        raise ModelError(f"unknown preset {name!r}: one of {', '.join(PRESETS)}")
    task = get_task(task_name)
    prompt = build_prompt(task, "zero_shot", task.labels[0])
    template = preset_template(name)
    return chat_prompt(TemplateTokenizer(template), prompt) if template is not None else prompt
