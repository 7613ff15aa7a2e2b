"""Which FAISS build searched: doctor and the manifest say it, with FAISS stubbed as a GPU build and as
a CPU build (this machine has neither a GPU nor faiss-gpu), and the vote's search gives the same
answer with no FAISS at all (an exact float64 brute force)."""

from __future__ import annotations

import types

import numpy as np
import pytest

import wasp_vllm
from tests.fakes import use_fake_backends
from wasp_vllm.ops import doctor
from wasp_vllm.ops.doctor import MISSING, OK, UNUSABLE
from wasp_vllm.privacy import search


def fake_faiss(gpus: int | None) -> types.SimpleNamespace:
    """A stand-in ``faiss`` module: a GPU build seeing ``gpus`` GPUs, or (None) a CPU build (its CPU
    indices are the real ones, so a run can search with it)."""
    import faiss

    module = types.SimpleNamespace(__version__="1.14.1", get_num_gpus=lambda: gpus or 0,
                                   IndexFlatL2=faiss.IndexFlatL2, IndexFlatIP=faiss.IndexFlatIP)  # fmt: skip
    if gpus is not None:
        module.StandardGpuResources = object
    return module


@pytest.fixture
def installed(monkeypatch):
    """Which FAISS wheel the package metadata reports."""

    def use(faiss_module, distribution: str, gpus_on_the_box: list[str]) -> None:
        monkeypatch.setattr(search, "_faiss", lambda: faiss_module)
        monkeypatch.setattr(search, "_installed", lambda name: name == distribution)
        monkeypatch.setattr(doctor, "version_of", lambda *names: (names[0], "1.14.1"))
        monkeypatch.setattr("wasp_vllm.engines.devices.nvidia_gpus", lambda: gpus_on_the_box)

    return use


def rows(found: list) -> dict:
    return {r.key: r for r in found}


def test_the_gpu_build_on_a_gpu_box_searches_on_the_gpu(installed):
    installed(fake_faiss(gpus=1), "faiss-gpu-cu12", ["NVIDIA H100 80GB HBM3"])
    build = search.faiss_build()
    assert build == {"distribution": "faiss-gpu-cu12", "gpu_code": True, "gpus": 1, "searches_on": "gpu"}
    assert search.gpu_available()
    found = rows(doctor.faiss_rows())
    assert found["faiss"].status == OK and "faiss-gpu-cu12" in found["faiss"].detail
    assert "GPU build" in found["faiss"].detail
    assert found["faiss-gpu"].status == OK and "1 GPU" in found["faiss-gpu"].detail


def test_the_cpu_build_on_a_gpu_box_is_flagged_with_the_fix(installed):
    installed(fake_faiss(gpus=None), "faiss-cpu", ["NVIDIA H100 80GB HBM3"])
    assert search.faiss_build()["searches_on"] == "cpu" and not search.gpu_available()
    found = rows(doctor.faiss_rows())
    assert found["faiss"].status == OK and "CPU build" in found["faiss"].detail
    assert found["faiss-gpu"].status == UNUSABLE and "'.[gpu]' (faiss-gpu-cu12)" in found["faiss-gpu"].detail


def test_the_cpu_build_without_a_gpu_is_fine(installed):
    installed(fake_faiss(gpus=None), "faiss-cpu", [])
    assert rows(doctor.faiss_rows())["faiss-gpu"].status == MISSING


def test_without_faiss_the_search_is_the_same_brute_force(monkeypatch):
    rng = np.random.default_rng(0)
    private, synth = rng.standard_normal((20, 8)), rng.standard_normal((90, 8))
    p_labels, s_labels = rng.integers(0, 3, 20), rng.integers(0, 3, 90)
    with_faiss = search.topq_near_far(private, p_labels, synth, s_labels, q=4, use_gpu=False)

    def missing():
        raise ImportError("No module named 'faiss'")

    monkeypatch.setattr(search, "_faiss", missing)
    monkeypatch.setattr(search, "_has_faiss", lambda: False)
    without = search.topq_near_far(private, p_labels, synth, s_labels, q=4)
    assert all(np.array_equal(a, b) for a, b in zip(with_faiss, without, strict=True))
    assert search.faiss_build()["distribution"] is None
    assert rows(doctor.faiss_rows())["faiss"].status == MISSING


def test_the_manifest_says_which_build_searched(tmp_path, monkeypatch, installed):
    use_fake_backends(monkeypatch)
    installed(fake_faiss(gpus=None), "faiss-cpu", [])
    result = wasp_vllm.generate(plms=["a", "b"], n=36, rounds=3, q=2, s=2, out=tmp_path / "run")
    assert result.manifest.search == {
        "distribution": "faiss-cpu", "gpu_code": False, "gpus": 0, "searches_on": "cpu"
    }  # fmt: skip
