"""The number type the PLMs compute in: bf16 where the machine has it natively, else float32."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from wasp_vllm.config import EngineArgs, EngineSettings
from wasp_vllm.engines import devices
from wasp_vllm.engines.options import EngineOptions

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(("cpuinfo", "native"), [(AVX2_ONLY, False), (ZEN4, True), (GRAVITON3, True)])
def test_native_bf16_is_read_off_the_cpu_flags(tmp_path, cpuinfo, native):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert devices.cpu_has_native_bf16(path) is native


def test_an_unreadable_cpuinfo_counts_as_no_native_bf16(tmp_path):
    assert devices.cpu_has_native_bf16(tmp_path / "absent") is False


def test_the_cpu_model_is_its_name_or_else_the_architecture(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n" + AVX2_ONLY)
    assert devices.cpu_model(path) == "AMD EPYC 9R14"
    assert devices.cpu_model(tmp_path / "absent") == platform.machine()
    arm = tmp_path / "cpuinfo-arm"
    arm.write_text(GRAVITON3)  # Arm's cpuinfo names no model
    assert devices.cpu_model(arm) == platform.machine()


@pytest.mark.parametrize(
    ("gpu", "native", "expected"),
    [(True, False, "bfloat16"), (False, True, "bfloat16"), (False, False, "float32")],
)
def test_auto_is_bf16_only_where_it_is_native(monkeypatch, gpu, native, expected):
    monkeypatch.setattr(devices, "gpu_available", lambda: gpu)
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: native)
    assert devices.model_dtype("auto") == expected
    assert devices.model_dtype("float16") == "float16"  # asked for: taken as it is
    assert devices.model_dtype("auto", device="cpu") == ("bfloat16" if native else "float32")


def test_engine_options_carry_the_resolved_type(monkeypatch):
    from wasp_vllm.engines.registry import ResolvedPLM
    from wasp_vllm.engines.vllm_engine import llm_arguments

    monkeypatch.setattr(devices, "gpu_available", lambda: False)
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr("wasp_vllm.engines.vllm_engine.gpu_available", lambda: False)
    auto = EngineOptions.from_settings(EngineSettings(), seed=0, plms=2)
    asked = EngineOptions.from_settings(
        EngineSettings(engine_args=EngineArgs(dtype="bfloat16")), seed=0, plms=2
    )
    assert (auto.dtype, asked.dtype) == ("float32", "bfloat16")
    plm = ResolvedPLM(name="p", path=Path("/nowhere"), chat=True, seq2seq=False)
    assert llm_arguments(plm, auto)["dtype"] == "float32"  # what vLLM is started with


CPU_VARIABLES = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ENABLE_V1_MULTIPROCESSING")


@pytest.mark.parametrize(("cores", "small"), [(2, True), (4, True), (16, False)])
def test_a_small_cpu_starts_its_engine_on_every_core_in_this_process_unless_the_user_says_otherwise(
    monkeypatch, cores, small
):
    from wasp_vllm.engines.vllm_engine import cpu_engine_env, engine_environment

    monkeypatch.setattr("wasp_vllm.engines.vllm_engine.gpu_available", lambda: False)
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    for name in CPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    options = EngineOptions.from_settings(
        EngineSettings(engine_args=EngineArgs(dtype="float32")), seed=0, plms=1
    )
    with engine_environment(options):  # what vLLM reads while the engine starts
        seen = {name: os.environ.get(name) for name in CPU_VARIABLES}
    assert seen["VLLM_CPU_KVCACHE_SPACE"] == str(int(options.cpu_kv_cache_gib))
    assert seen["VLLM_CPU_NUM_OF_RESERVED_CPU"] == ("0" if small else None)  # vLLM's own default keeps one
    assert seen["VLLM_ENABLE_V1_MULTIPROCESSING"] == ("0" if small else None)  # vLLM's: two processes
    assert not any(name in os.environ for name in CPU_VARIABLES)  # a process started later gets none
    served = cpu_engine_env(1, in_process=False)  # a `vllm serve` is a process of its own anyway
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in served and served["VLLM_CPU_KVCACHE_SPACE"] == "1"
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # the user's choice stands
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with engine_environment(options):
        assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"  # and stays after the start
