"""Which accelerator this process can use: the one place that asks.

Engines, the embedder, the task model and Hot PATE's teachers all follow :func:`torch_device`;
the round loop asks :func:`gpu_available` whether PLMs may generate concurrently.  torch is
imported only when asked (a CPU-only user of the pure-logic modules never pays for it), and a
machine without torch counts as CPU-only.  ``WASP_VLLM_DEVICE=cpu`` forces the CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache


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
