"""Hot PATE's ``--engine auto`` (issue 57, item 3): vLLM only on a GPU with batch invariance on
(``VLLM_BATCH_INVARIANT=1``); otherwise transformers, whose teacher batches are padded to a public
length.  Without batch invariance vLLM's batch shapes, and so the last bits of a teacher's
distribution, follow the other teachers' private prompts.
"""

from __future__ import annotations

import pytest

import wasp_vllm.hotpate.generate as hot
import wasp_vllm.hotpate.vllm_teachers as vllm_teachers
from wasp_vllm.hotpate.generate import TeacherModel, run_hotpate


class Loaded(Exception):  # noqa: N818 - a signal, not an error: which engine's loader ran
    def __init__(self, engine: str) -> None:
        super().__init__(engine)
        self.engine = engine


def _machine(monkeypatch, gpu: bool, invariant: str | None) -> None:
    monkeypatch.setattr("wasp_vllm.engines.devices.gpu_available", lambda: gpu)
    if invariant is None:
        monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    else:
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", invariant)


@pytest.mark.parametrize(
    ("gpu", "invariant", "engine"),
    [(False, None, "hf"), (False, "1", "hf"), (True, None, "hf"), (True, "0", "hf"), (True, "1", "vllm")],
)
def test_auto_picks_vllm_only_on_a_gpu_with_batch_invariance(monkeypatch, gpu, invariant, engine):
    _machine(monkeypatch, gpu, invariant)
    assert TeacherModel(engine="auto").resolved_engine() == engine
    assert TeacherModel(engine="hf").resolved_engine() == "hf"  # an explicit choice is kept
    assert TeacherModel(engine="vllm").resolved_engine() == "vllm"


@pytest.mark.parametrize(("invariant", "engine"), [(None, "hf"), ("1", "vllm")])
def test_a_run_on_a_gpu_loads_the_engine_auto_picked(monkeypatch, invariant, engine):
    _machine(monkeypatch, True, invariant)

    def loader(name: str):
        def load(*_args, **_kwargs):
            raise Loaded(name)

        return load

    monkeypatch.setattr(hot, "load_lm", loader("hf"))
    monkeypatch.setattr(vllm_teachers, "load_vllm", loader("vllm"))
    with pytest.raises(Loaded) as loaded:
        run_hotpate(["a good drug", "a bad drug"] * 4, ["good", "bad"] * 4, ["good", "bad"], teachers=4,
                    n_samples=1, epsilon=4.0, delta=1e-5)  # fmt: skip
    assert loaded.value.engine == engine
