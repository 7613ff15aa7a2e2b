"""The data set's card: ``README.md`` beside ``synthetic.parquet``, in the Hugging Face card format.

A YAML header (licence, task category, size class, language, tags, and the data file, so that
``datasets.load_dataset(FOLDER)`` reads ``synthetic.parquet`` alone) and a body a reader of the
data set needs: the method, the PLMs, the guarantee in one plain sentence, what the data must not be
used for, the labels' counts and how to load it.  The card is published like the manifest and
obeys the same rule: it is made from the manifest and the synthetic rows only (settings, public
models, functions of the noisy votes; no timing), so neighbouring private files give the same
card byte for byte (``tests/test_neighbouring.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import yaml

from wasp_vllm.privacy.report import Neighbourhood, PrivacyReport
from wasp_vllm.strategies import get_strategy
from wasp_vllm.tasks import TaskSpec

#: The licence a card gets unless the run (``--license``) or ``publish --license`` names another.
DEFAULT_LICENSE = "other"
CARD_FILE = "README.md"
TAGS = ("synthetic", "differential-privacy", "wasp", "wasp-vllm")
#: The Hub's size classes: upper bounds and their names.
SIZE_CLASSES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))

NOT_FOR = """\
- **Not real data.** Do not use it to estimate facts about the real population, or as a test set of
  real-world performance: train on it, evaluate on real data.
- **Not about anyone.** Do not use it to make decisions about a person, or to try to recover or
  single out anyone behind the private data; the guarantee above bounds what it reveals about them.
- **Not checked for truth.** The texts were written by language models: they may state false,
  biased or harmful things (in reviews of medicines, for example, wrong effects or doses).
"""


def size_class(rows: int) -> str:
    return next((name for bound, name in SIZE_CLASSES if rows < bound), "n>1M")


def guarantee_sentence(manifest: Mapping[str, Any]) -> str:
    """The guarantee in one plain sentence (or why there is none)."""
    privacy, cfg = PrivacyReport.from_json(manifest["privacy"]), manifest.get("config", {})
    where = privacy.neighbourhood
    if privacy.epsilon_void:
        return (
            "**There is no privacy guarantee**: the noise came from a fixed, public seed (`--noise-seed`, "
            "a test setting), so anyone can remove it. Do not use this data set as private data."
        )
    if not privacy.compositions:
        return "The private records were never read: this data set holds no information about them."
    change = "added or removed" if cfg.get("neighbour") == "add_remove" else "replaced"
    return (
        f"This data set is ({privacy.epsilon_spent:.3g}, {privacy.delta:g})"
        f"-differentially private: whether any one {where.unit} was {change} in the private file it was "
        f"made from changes the chance of any outcome by a factor of at most e^ε (plus δ); the privacy "
        f"unit is one {where.unit}{_unit_note(where)}."
    )


def _unit_note(where: Neighbourhood) -> str:
    return f" (at most {where.max_records_per_unit} records each)" if where.unit == "user" else ""


def header(manifest: Mapping[str, Any], language: str | None, license: str) -> str:
    cfg = manifest.get("config", {})
    data: dict[str, Any] = {
        "license": license,
        "task_categories": ["text-classification"],
        **({"language": [language]} if language else {}),
        "size_categories": [size_class(int(manifest.get("output", {}).get("rows", 0)))],
        "tags": list(dict.fromkeys([*TAGS, str(cfg.get("strategy", "wasp"))])),
        "pretty_name": pretty_name(manifest),
        "configs": [
            {"config_name": "default", "data_files": [{"split": "train", "path": "synthetic.parquet"}]}
        ],
    }
    return "---\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True) + "---\n"


def pretty_name(manifest: Mapping[str, Any]) -> str:
    rows = manifest.get("output", {}).get("rows", "?")
    return f"WASP synthetic {manifest.get('task', 'text')} data ({rows} samples)"


def dataset_card(
    manifest: Mapping[str, Any],
    label_counts: Mapping[str, int],
    *,
    language: str | None = None,
    license: str | None = None,
    strategy_summary: str = "",
) -> str:
    """The whole card; ``label_counts`` are the synthetic set's (public), in the task's label order."""
    cfg = manifest.get("config", {})
    chosen = str(license or cfg.get("license") or DEFAULT_LICENSE)
    parts = [
        header(manifest, language, chosen),
        f"# {pretty_name(manifest)}\n",
        _about(manifest, strategy_summary),
        "## Privacy\n\n" + guarantee_sentence(manifest) + "\n\n" + _privacy_details(manifest),
        _utility(manifest),
        "## What this data must not be used for\n\n" + NOT_FOR,
        _models(manifest),
        _labels(manifest, label_counts),
        _loading(manifest),
        _licence(manifest, chosen),
    ]
    return "\n".join(part for part in parts if part)


def _about(manifest: Mapping[str, Any], strategy_summary: str) -> str:
    cfg = manifest.get("config", {})
    versions = manifest.get("versions", {})
    method = f" ({strategy_summary})" if strategy_summary else ""
    voted_for = "nearest" if cfg.get("far_votes") == "off" else "nearest and furthest"
    return (
        f"Synthetic labelled text for the task `{manifest.get('task')}`, written by "
        f"{len(cfg.get('plms', []))} language models collaborating under differential privacy, with "
        f"wasp-vllm {versions.get('wasp-vllm', '')}: method `{cfg.get('strategy')}`{method}, after "
        "[WASP](https://arxiv.org/abs/2502.00245). A small private labelled set guided the generation: in "
        f"every round but the last of T={cfg.get('rounds')}, each private record voted (Top-Q={cfg.get('q')} "
        f"{voted_for} synthetic samples of its label), Gaussian noise was added to the vote "
        "histograms, and only those noisy votes chose the next round's in-context examples and how "
        "many samples each model writes. No private text ever entered a prompt or this data set.\n"
    )


def _privacy_details(manifest: Mapping[str, Any]) -> str:
    privacy = PrivacyReport.from_json(manifest["privacy"])
    where = privacy.neighbourhood
    rows = {
        "ε spent": f"{privacy.epsilon_spent:.4g} of a budget of {privacy.epsilon_budget}",
        "δ": f"{privacy.delta}",
        "neighbouring data sets": where.input_file,
        "privacy unit": where.unit,
        "which records voted": where.selection,
        "noisy releases": f"{privacy.compositions} (σ {_sigmas(privacy.sigmas)})",
        "accountant": privacy.accountant,
    }
    lines = [f"| {k} | {v} |" for k, v in rows.items()]
    return "| | |\n|---|---|\n" + "\n".join(lines) + "\n"


def _utility(manifest: Mapping[str, Any]) -> str:
    """The utility check's figures on the owner's records, where the run made it (else nothing)."""
    check = PrivacyReport.from_json(manifest["privacy"]).utility_check
    if check is None:
        return ""
    rows = "\n".join(f"| {s.name} | {s.macro_f1} | {s.accuracy} |" for s in check.sets)
    return (
        "## Utility check on the private records\n\n"
        "Task models (logistic regression on sentence embeddings) trained on this data set, on the "
        "zero-shot samples of its first round alone, and the nearest label description (no data), "
        f"each scored on the private records through noisy confusion matrices (part of the guarantee "
        f"above); {check.confidence:.0%} intervals cover the noise and the sampling error:\n\n"
        f"| task model from | macro-F1 | accuracy |\n|---|---|---|\n{rows}\n\n"
        f"This data set is {check.reading()}.\n"
    )


def _sigmas(sigmas: Sequence[float]) -> str:
    distinct = sorted({round(float(s), 4) for s in sigmas})
    return ", ".join(f"{s:g}" for s in distinct) or "none"


def _models(manifest: Mapping[str, Any]) -> str:
    from wasp_vllm.engines.presets import PRESETS

    plms = manifest.get("plms", {})
    weights = dict(
        zip(manifest.get("config", {}).get("plms", []), plms.get("final_weights", []), strict=False)
    )
    work = manifest.get("work", {})
    lines = ["| PLM | model | samples kept | final weight |", "|---|---|---|---|"]
    for plm, weight in weights.items():
        preset = PRESETS.get(plm.split("@", 1)[0])
        model = (preset.hf_id or preset.description) if preset else plm.split("@", 1)[0]
        kept = work.get(plm, {}).get("kept", "?")
        dropped = " (dropped)" if plm in (plms.get("dropped") or {}) else ""
        lines.append(f"| {plm}{dropped} | {model} | {kept} | {float(weight):.3f} |")
    return "## Models\n\n" + "\n".join(lines) + "\n"


def _labels(manifest: Mapping[str, Any], label_counts: Mapping[str, int]) -> str:
    lines = ["| label | samples |", "|---|---|"]
    lines += [f"| {label} | {count} |" for label, count in label_counts.items()]
    lines.append(f"| **all** | {sum(label_counts.values())} |")
    return "## Labels (counts of this synthetic set)\n\n" + "\n".join(lines) + "\n"


def _loading(manifest: Mapping[str, Any]) -> str:
    return (
        "## How to load it\n\n"
        "```python\n"
        "from datasets import load_dataset\n\n"
        'ds = load_dataset("THIS_FOLDER_OR_HUB_REPO", split="train")\n'
        'df = ds.to_pandas()  # or pandas.read_parquet("synthetic.parquet")\n'
        "```\n\n"
        "Columns: `id`, `text`, `label`, `attribute`, `plm` (the model that wrote it), `round`, "
        "`prompt_kind`, and `embedding` (the sentence embedding the votes used). `manifest.json` beside "
        "it records every setting, the privacy spent and, per round, the samples each model generated "
        f"and kept; `synthetic.parquet` has sha256 `{manifest.get('output', {}).get('sha256', '?')}`.\n"
    )


def _licence(manifest: Mapping[str, Any], license: str) -> str:
    default = " (the default: choose one with `--license`)" if license == DEFAULT_LICENSE else ""
    return (
        f"## Licence\n\n`{license}`{default}. The models that wrote the texts come with licences of "
        "their own, some of which restrict what their outputs may be used for: check those of the models "
        "above.\n"
    )


def card_for_run(
    manifest: Mapping[str, Any], final: pa.Table, task: TaskSpec | None, license: str | None = None
) -> str:
    """The card of a finished run from its manifest and its synthetic rows (labels counted here).

    ``task`` orders the labels and gives the language (None: labels sorted, no language)."""
    counted = Counter(final.column("label").to_pylist())
    counts = {label: counted.get(label, 0) for label in (task.labels if task else [])}
    counts |= {label: n for label, n in sorted(counted.items()) if label not in counts}
    language = task.language if task else None
    return dataset_card(
        manifest, counts, language=language, license=license, strategy_summary=_method(manifest)
    )


def _method(manifest: Mapping[str, Any]) -> str:
    """The method in a phrase, with the prompt after round 0 the run used when it is not the method's
    own (WASP with few-shot prompts)."""
    config = manifest.get("config", {})
    strategy = get_strategy(str(config.get("strategy", "wasp")))
    later = config.get("later_prompt")
    if not strategy.chooses_later_prompt or later in (None, strategy.later_prompt.value):
        return strategy.summary
    prompts = "few-shot prompts from the good pool" if later == "few_shot" else "contrastive prompts"
    return f"{strategy.summary}; this run: {prompts} after round 0"
