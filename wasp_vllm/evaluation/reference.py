"""``evaluate --reference-public``: a reference declared public must share no record with the private
data, or its label agreement (an un-noised statistic of its records) would publish private records.

What is checked, and how:

* the ``--private`` set passed alongside: record by record (both are at hand), or by split for a
  built-in set;
* the private data of the run that wrote the synthetic file: a built-in set by its splits (the
  manifest names it); otherwise record by record against the keyed hashes of its texts that the
  run kept in its ``private/`` folder (``record_keys.json``, under the owner key), which sees a
  byte copy, a hard link or a renamed file alike.  Where those keys are not at hand (a published
  folder, a run from before they were kept) or were made under another owner key, nothing can be
  checked, and the declaration is refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from wasp_vllm.evaluation.common import EvaluationError
from wasp_vllm.evaluation.settings import EvalSettings

log = logging.getLogger(__name__)

DROP = "drop --reference-public, or use a reference without private records"


def check_declared_public(settings: EvalSettings, task: Any, synthetic: Path) -> None:
    """Refuse a reference declared public that is, or shares a record with, the private set passed
    alongside or the private data of the run that wrote ``synthetic``; say what was checked."""
    from wasp_vllm.data.records import load_private
    from wasp_vllm.data.resolve import builtin_name
    from wasp_vllm.privacy.secrets import RecordKeys, owner_key

    reference, private = str(settings.reference), settings.private
    texts = load_private(reference, task, settings.columns()).texts
    if private is not None and _shares_records(reference, texts, private, task, settings):
        raise EvaluationError(f"the reference {reference!r} shares records with the private set {private!r}: "
                              f"it cannot be declared public ({DROP})")  # fmt: skip
    source = _run_private_source(synthetic)
    if source is not None and builtin_name(source) is not None:
        if _splits_overlap(reference, source):
            raise EvaluationError(f"the reference {reference!r} overlaps the private data of the run that "
                                  f"wrote {synthetic}: it cannot be declared public ({DROP})")  # fmt: skip
        log.info("--reference-public: the run read the built-in %s; the reference is another split", source)
        return
    keys = RecordKeys.of_run(synthetic.parent)
    if keys is None:
        raise EvaluationError(
            f"--reference-public cannot be checked: {synthetic.parent}/private/record_keys.json, which "
            "the run kept to tell its private records, is not there (a published folder, or a run "
            "from before it was kept); evaluate beside the run's own folder, or drop --reference-public"
        )
    key = owner_key()
    try:
        shared = keys.shared_with(texts, key)
    except ValueError:
        raise EvaluationError(
            "--reference-public cannot be checked: the run kept its record keys under another owner "
            "key (WASP_VLLM_HOME); evaluate as the run's owner, or drop --reference-public"
        ) from None
    if shared:
        raise EvaluationError(f"the reference {reference!r} shares records with the private data of the run "
                              f"that wrote {synthetic}: it cannot be declared public ({DROP})")  # fmt: skip
    log.info("--reference-public: checked record by record against the run's private data (none shared)")


def _shares_records(
    reference: str, texts: list[str], private: str, task: Any, settings: EvalSettings
) -> bool:
    """Whether the reference and the private set passed alongside share a record (a built-in pair
    by its splits: a plain name reads ``fit``)."""
    from wasp_vllm.data.records import load_private
    from wasp_vllm.data.resolve import builtin_name

    if builtin_name(reference) is not None and builtin_name(private) is not None:
        return _splits_overlap(reference, private)
    fold = {" ".join(t.casefold().split()) for t in load_private(private, task, settings.columns()).texts}
    return any(" ".join(t.casefold().split()) in fold for t in texts)


def _run_private_source(synthetic: Path) -> str | None:
    """The private data of the run that wrote ``synthetic``, as its manifest names it (a built-in
    set's name, a file's keyed fingerprint, or ``<in-memory>``); None without a readable manifest."""
    try:
        source = json.loads((synthetic.parent / "manifest.json").read_text())["config"]["private"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if isinstance(source, str) else None


def _splits_overlap(a: str, b: str) -> bool:
    """Whether two splits of built-in sets may share records (a plain name reads its ``fit`` split,
    as :func:`~wasp_vllm.data.records.load_private` does; ``train`` is fit + validation)."""
    (name_a, _, split_a), (name_b, _, split_b) = a.partition(":"), b.partition(":")
    if name_a != name_b:
        return False
    splits = {split_a or "fit", split_b or "fit"}
    return len(splits) == 1 or ("train" in splits and "test" not in splits)
