"""PLM presets: today's instruct models beside the paper's set, their chat templates, their sampling,
resolution from the local Hugging Face cache, and the error a user gets when a model is missing.

No hub is reachable here, so no weights or tokenizers: resolution runs against a stand-in cache
folder, and prompts are rendered with the chat templates the package ships."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fakes import use_fake_backends
from wasp_vllm.cli import app
from wasp_vllm.engines.base import GenerationParams, chat_prompt
from wasp_vllm.engines.chat_templates import (
    TemplateError,
    TemplateTokenizer,
    ensure_chat_template,
    preset_template,
    render_chat,
)
from wasp_vllm.engines.presets import CURRENT, PAPER, PRESETS, sampling_for
from wasp_vllm.engines.registry import ModelError, resolve_plm
from wasp_vllm.tasks import build_prompt, get_task

CURRENT_SET = {"llama3", "qwen", "mistral", "gemma", "phi"}
PAPER_SET = {"gpt2", "llama2", "vicuna", "opt", "chatglm3", "flant5"}

#: What each family's prompt must hold around the user's text: (before it, after it, at the end).
MARKERS = {
    "llama3": ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>",
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "qwen": ("<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n"),
    "mistral": ("<s>[INST] ", "[/INST]", "[/INST]"),
    "gemma": ("<bos><start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n"),
    "phi": ("<|user|>\n", "<|end|>\n", "<|assistant|>\n"),
    "llama2": ("<s>[INST] ", " [/INST]", " [/INST]"),
    "smollm2": ("<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n"),
}  # fmt: skip


def test_current_models_sit_beside_the_papers_set():
    current = {p.name for p in PRESETS.values() if p.group == CURRENT}
    assert current == CURRENT_SET
    assert {p.name for p in PRESETS.values() if p.group == PAPER} == PAPER_SET
    for name in CURRENT_SET:
        preset = PRESETS[name]
        assert preset.chat and preset.template and preset.hf_id and "/" in preset.hf_id
        assert 5 < preset.bf16_gib < 20, name  # 4-9B parameters, 2 bytes each
        assert preset.sampling.temperature is not None


@pytest.mark.parametrize("name", sorted(MARKERS))
def test_each_chat_template_wraps_a_task_prompt_in_its_role_markers(name):
    task = get_task("drugs")
    prompt = build_prompt(task, "zero_shot", "positive")
    assert prompt.endswith('"')
    text = chat_prompt(TemplateTokenizer(str(preset_template(name))), prompt)
    before, after, end = MARKERS[name]
    body = prompt[:-1].rstrip()  # the trailing quote moves into the answer (a prefill)
    assert before + body in text, text
    assert text.index(before) < text.index(body)
    assert after in text[text.index(body) :]
    assert text.endswith(end + '"'), text  # the model's turn opens with the prefilled quote
    assert text.count(body) == 1


def test_templates_refuse_what_their_model_refuses():
    with pytest.raises(TemplateError, match="user and assistant"):
        render_chat(str(preset_template("gemma")), [{"role": "tool", "content": "x"}])
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert "<|start_header_id|>system<|end_header_id|>" in render_chat(str(preset_template("llama3")), system)
    assert "Be brief.\n\nHi" in render_chat(str(preset_template("gemma")), system)  # folded into the turn
    assert preset_template("gemma3") is None and preset_template("/some/dir") is None  # base, path


def test_a_tokenizer_without_a_template_gets_the_presets():
    class Bare:
        chat_template = None

    assert ensure_chat_template(Bare(), "qwen").chat_template == preset_template("qwen")

    class Own:
        chat_template = "{{ 'mine' }}"

    assert ensure_chat_template(Own(), "qwen").chat_template == "{{ 'mine' }}"


def test_presets_sampling_applies_only_where_the_run_sets_none():
    base = GenerationParams(temperature=1.0, top_p=1.0, top_k=50)
    qwen = sampling_for("qwen", base, explicit=set())
    assert (qwen.temperature, qwen.top_p, qwen.top_k) == (0.7, 0.8, 20)
    chosen = sampling_for("qwen@http://host:8000/v1", base, explicit={"temperature"})
    assert (chosen.temperature, chosen.top_p) == (1.0, 0.8)
    assert sampling_for("smollm2", base, set()) == base and sampling_for("my/dir", base, set()) == base


def test_a_run_samples_each_preset_with_its_own_defaults(tmp_path, monkeypatch):
    import wasp_vllm

    engines = use_fake_backends(monkeypatch)
    monkeypatch.chdir(tmp_path)
    wasp_vllm.generate(plms=["qwen", "b"], n=12, rounds=1, out="out", label_prior="uniform")
    assert {p.temperature for p in engines["qwen"].params} == {0.7}
    assert {p.top_k for p in engines["qwen"].params} == {20}
    assert {p.temperature for p in engines["b"].params} == {1.0}  # no preset: the run's setting
    wasp_vllm.generate(plms=["qwen", "b"], n=12, rounds=1, out="out2", temperature=0.9, label_prior="uniform")
    assert {p.temperature for p in engines["qwen"].params[-1:]} == {0.9}  # the user's choice wins


def fake_hub_cache(root: Path, repo_id: str) -> Path:
    """A Hugging Face cache folder holding one model snapshot (a config and an empty weights file)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snapshot / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (snapshot / "model.safetensors").write_bytes(b"")
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_preset_resolves_from_the_local_cache_and_a_missing_one_says_how_to_get_it(hub_cache):
    snapshot = fake_hub_cache(hub_cache, "Qwen/Qwen2.5-7B-Instruct")
    plm = resolve_plm("qwen")
    assert plm.path == snapshot and plm.chat and not plm.seq2seq
    with pytest.raises(ModelError) as missing:
        resolve_plm("llama3")
    message = str(missing.value)
    assert "meta-llama/Llama-3.1-8B-Instruct" in message and "hf download" in message
    assert "licence" in message  # gated: the hub wants it accepted first


def test_models_lists_every_preset_with_what_it_needs_and_whether_it_resolves(hub_cache, monkeypatch):
    fake_hub_cache(hub_cache, "microsoft/Phi-3.5-mini-instruct")
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert set(PRESETS) <= set(lines)
    assert "microsoft/Phi-3.5-mini-instruct" in lines["phi"] and lines["phi"].rstrip(" │").endswith("yes")
    assert "15 GiB" in lines["llama3"] and lines["llama3"].rstrip(" │").endswith("no")
    assert "hf download HUB_ID" in " ".join(result.output.split())
    shown = CliRunner().invoke(app, ["models", "--show-prompt", "mistral"])
    assert shown.exit_code == 0 and shown.output.startswith("<s>[INST] ")


def test_generate_with_a_missing_model_fails_before_anything_loads(hub_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["generate", "--plms", "gemma,smollm2", "--n", "30", "--out", "out"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "google/gemma-2-9b-it" in message and "hf download google/gemma-2-9b-it" in message
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()
    unknown = CliRunner().invoke(app, ["models", "--show-prompt", "llama4"])
    assert unknown.exit_code == 2 and "unknown preset 'llama4'" in unknown.output
