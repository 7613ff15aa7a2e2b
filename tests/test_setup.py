"""The set-up picks the vLLM build the machine needs: CUDA where an NVIDIA GPU is, CPU elsewhere.

CI has no GPU, so ``nvidia-smi`` is stubbed both ways: a stand-in script that lists a GPU, one
that fails as it does on a machine without a driver, and none at all.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import tomllib

from wasp_vllm.engines.devices import nvidia_gpus

ROOT = Path(__file__).resolve().parents[1]
H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4b1c)"


def stub(folder: Path, script: str | None) -> dict[str, str]:
    """An environment whose PATH has a stand-in ``nvidia-smi`` (or none) ahead of the system's."""
    folder.mkdir(exist_ok=True)
    if script is not None:
        tool = folder / "nvidia-smi"
        tool.write_text("#!/bin/sh\n" + script + "\n")
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "WASP_VLLM_BUILD"}
    return env | {"PATH": f"{folder}:/usr/bin:/bin"}


GPU_BOX = 'case "$1" in -L) echo "' + H100 + '";; *) echo "NVIDIA H100 80GB HBM3";; esac'
NO_DRIVER = 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver" >&2; exit 9'


@pytest.mark.parametrize(("script", "build"), [(GPU_BOX, "gpu"), (NO_DRIVER, "cpu"), (None, "cpu")])
def test_the_build_follows_the_gpu(tmp_path, script, build):
    env = stub(tmp_path / "bin", script)
    out = subprocess.run(["sh", "launch/which_build.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == build
    plan = subprocess.run(["make", "-n", "demo"], cwd=ROOT, env=env, capture_output=True, text=True)
    installs = f'pip install -q -e ".[{build},dev,ray]"'
    assert installs in plan.stdout or (ROOT / f".venv/.installed-{build}").exists()
    assert f"demo on the {build} build of vLLM" in plan.stdout


def test_an_explicit_choice_wins(tmp_path):
    env = stub(tmp_path / "bin", GPU_BOX) | {"WASP_VLLM_BUILD": "cpu"}
    out = subprocess.run(["sh", "launch/which_build.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "cpu"


def test_the_demo_names_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", stub(tmp_path / "bin", GPU_BOX)["PATH"])
    assert nvidia_gpus() == ["NVIDIA H100 80GB HBM3"]
    monkeypatch.setenv("PATH", stub(tmp_path / "none", None)["PATH"])
    assert nvidia_gpus() == []


#: The FAISS wheel each build installs: both provide `import faiss`, so a GPU box must get only the GPU one.
FAISS_WHEEL = {"gpu": "faiss-gpu-cu12", "cpu": "faiss-cpu"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


@pytest.mark.parametrize(("script", "build"), [(GPU_BOX, "gpu"), (NO_DRIVER, "cpu"), (None, "cpu")])
def test_the_faiss_build_follows_the_gpu(tmp_path, script, build):
    env = stub(tmp_path / "bin", script)
    out = subprocess.run(["sh", "launch/which_build.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == build
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _names(project["dependencies"]) | _names(project["optional-dependencies"][build])
    installed |= _names(project["optional-dependencies"]["dev"])  # `make` installs .[BUILD,dev,ray]
    installed |= _names(project["optional-dependencies"]["ray"])
    faiss = {name for name in installed if name.startswith("faiss")}
    assert faiss == {FAISS_WHEEL[build]}, f"the {build} set-up installs {faiss}"
