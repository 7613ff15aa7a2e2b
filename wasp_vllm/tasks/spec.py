"""Task specifications: labels, attributes and prompt templates, kept as data.

A task is a TOML or YAML file, not code, so that a user can add a new task (or
reword a prompt) without touching the package.  This module validates such a
file into a :class:`TaskSpec`, renders the three prompt kinds of WASP
(zero-shot, few-shot, contrastive) and draws the in-context examples.

Prompt convention: every rendered prompt ends right where the sample starts
(normally with an opening double quote), so the model's continuation *is* the
sample and generation ends at one of ``TaskSpec.stop`` (by default a closing
double quote or a blank line).  In-context examples are always synthetic texts
chosen by the pipeline; this module never sees private data.
"""

from __future__ import annotations

import logging
import re
import string
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

logger = logging.getLogger(__name__)


class PromptKind(StrEnum):
    """The three prompts of WASP (Table 7 of the paper); a task file holds a template of each."""

    ZERO_SHOT = "zero_shot"
    FEW_SHOT = "few_shot"
    CONTRASTIVE = "contrastive"


PROMPT_KINDS: tuple[str, ...] = tuple(kind.value for kind in PromptKind)
TASK_FILE_SUFFIXES: tuple[str, ...] = (".toml", ".yaml", ".yml")
BUILTIN_DIR = Path(__file__).parent / "builtin"

# Placeholders each template may use.  Anything else is a typo that would only
# surface at generation time (a KeyError deep in the pipeline), so reject it at
# load time instead.
_COMMON = {"label", "label_text", "attribute", "attribute_text"}
_ALLOWED_PLACEHOLDERS: dict[str, set[str]] = {
    "zero_shot": _COMMON,
    "few_shot": _COMMON | {"examples"},
    "contrastive": _COMMON | {"good_examples", "bad_examples"},
    "example": _COMMON | {"text"},
    "good_example": _COMMON | {"text"},
    "bad_example": _COMMON | {"text"},
}
_REQUIRED_PLACEHOLDERS: dict[str, set[str]] = {
    "zero_shot": set(),
    "few_shot": {"examples"},
    "contrastive": {"good_examples", "bad_examples"},
    "example": {"text"},
    "good_example": {"text"},
    "bad_example": {"text"},
}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")


class TaskError(ValueError):
    """A task name, task file or prompt request that cannot be honoured."""


def _placeholders(template: str) -> set[str]:
    """Field names used in a ``str.format`` template (raises ValueError on bad braces)."""
    names: set[str] = set()
    for _, field, spec, conv in string.Formatter().parse(template):
        if field is None:
            continue
        if field == "" or not field.isidentifier():
            raise ValueError(
                f"placeholder {{{field}}} is not a plain name (write literal braces as {{{{ }}}})"
            )
        if spec or conv:
            raise ValueError(f"placeholder {{{field}}} must not carry a format spec or conversion")
        names.add(field)
    return names


class PromptTemplates(BaseModel):
    """The ``str.format`` templates of one task.

    ``zero_shot``/``few_shot``/``contrastive`` are whole prompts; ``example``,
    ``good_example`` and ``bad_example`` render one in-context example each
    (few-shot uses ``example``; contrastive uses the good/bad pair), and the
    rendered lines are joined with newlines into ``{examples}``,
    ``{good_examples}`` and ``{bad_examples}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    zero_shot: str
    few_shot: str
    contrastive: str
    example: str = 'The sample is: "{text}"'
    good_example: str = 'A good sample is: "{text}"'
    bad_example: str = 'A bad sample is: "{text}"'

    @model_validator(mode="after")
    def _check_placeholders(self) -> PromptTemplates:
        for name, allowed in _ALLOWED_PLACEHOLDERS.items():
            template: str = getattr(self, name)
            try:
                used = _placeholders(template)
            except ValueError as exc:
                raise ValueError(f"templates.{name}: {exc}") from None
            unknown = sorted(used - allowed)
            if unknown:
                raise ValueError(
                    f"templates.{name}: unknown placeholder(s) {unknown}; allowed: {sorted(allowed)}"
                )
            missing = sorted(_REQUIRED_PLACEHOLDERS[name] - used)
            if missing:
                raise ValueError(f"templates.{name}: must contain placeholder(s) {missing}")
        for name in PROMPT_KINDS:
            template = getattr(self, name)
            # A trailing space or newline makes tokenizers split the first word
            # of the continuation oddly; the sample must start right after it.
            if not template.strip() or template != template.rstrip():
                raise ValueError(f"templates.{name}: must be non-empty and end without trailing whitespace")
        return self


class TaskSpec(BaseModel):
    """One classification task for which labelled synthetic text is generated.

    Fields are pure data (see ``wasp_vllm/tasks/builtin/*.toml``).  Unknown keys
    are rejected so that a misspelt key in a user's file is an error, not a
    silently ignored setting.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="short identifier, lower case, digits and underscores")
    description: str = ""
    labels: list[str] = Field(min_length=2)
    label_descriptions: dict[str, str] = Field(
        default_factory=dict,
        description="phrase for {label_text} per label; defaults to the label with '_' read as ' '",
    )
    label_aliases: dict[str, list[str]] = Field(
        default_factory=dict,
        description="other spellings of a label accepted when loading data (matched case-insensitively)",
    )
    attribute_name: str | None = None
    attribute_values: list[str] = Field(default_factory=list)
    label_attribute_values: dict[str, list[str]] = Field(
        default_factory=dict, description="per-label attribute values; override attribute_values"
    )
    attribute_template: str = Field(
        default="", description="rendered as {attribute_text} when an attribute is given; uses {attribute}"
    )
    templates: PromptTemplates
    stop: list[str] = Field(default_factory=lambda: ['"', "\n\n"], min_length=1)
    max_new_tokens: int = Field(default=128, gt=0)
    language: str | None = Field(
        default=None, description="the texts' language, e.g. 'en' (the data set card states it)"
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be lower case letters, digits and underscores, e.g. 'yelp_rating'")
        return value

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, value: list[str]) -> list[str]:
        if any(not label.strip() for label in value):
            raise ValueError("labels must be non-empty strings")
        if len(set(value)) != len(value):
            raise ValueError("labels must be unique")
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> TaskSpec:
        self._check_label_keys()
        self._check_aliases()
        self._check_attributes()
        return self

    def _check_label_keys(self) -> None:
        known = set(self.labels)
        for field in (
            "label_descriptions",
            "label_aliases",
            "label_attribute_values",
        ):
            extra = sorted(set(getattr(self, field)) - known)
            if extra:
                raise ValueError(f"{field}: keys {extra} are not labels of the task ({self.labels})")

    def _check_aliases(self) -> None:
        owner: dict[str, str] = {}
        for label in self.labels:
            for spelling in [label, *self.label_aliases.get(label, [])]:
                key = normalize_label_key(spelling)
                if owner.setdefault(key, label) != label:
                    raise ValueError(
                        f"label_aliases: spelling {spelling!r} is claimed by both "
                        f"{owner[key]!r} and {label!r}"
                    )

    def _check_attributes(self) -> None:
        has_values = bool(self.attribute_values) or bool(self.label_attribute_values)
        if self.attribute_name is None:
            if has_values or self.attribute_template:
                raise ValueError("attribute values/template given but attribute_name is not set")
            return
        if not self.attribute_values:
            lacking = [label for label in self.labels if not self.label_attribute_values.get(label)]
            if lacking:
                raise ValueError(f"attribute '{self.attribute_name}': no values for labels {lacking}")
        try:
            used = _placeholders(self.attribute_template)
        except ValueError as exc:
            raise ValueError(f"attribute_template: {exc}") from None
        if used - {"attribute"} or (self.attribute_template and "attribute" not in used):
            raise ValueError("attribute_template must use exactly the placeholder {attribute}")

    # ----- convenience -------------------------------------------------------------------------

    def label_text(self, label: str) -> str:
        """The phrase that names ``label`` inside a prompt."""
        return self.label_descriptions.get(label, label.replace("_", " "))

    def attribute_choices(self, label: str) -> list[str]:
        """Attribute values that suit ``label`` (empty when the task has no attribute)."""
        if self.attribute_name is None:
            return []
        return list(self.label_attribute_values.get(label) or self.attribute_values)

    def label_index(self, label: str) -> int:
        """Index of ``label`` in ``labels``; a clear TaskError when it is not a label."""
        try:
            return self.labels.index(label)
        except ValueError:
            raise TaskError(f"task '{self.name}' has no label {label!r}; labels: {self.labels}") from None

    def alias_map(self) -> dict[str, str]:
        """Normalized spelling -> label, for mapping label values found in data files."""
        mapping: dict[str, str] = {}
        for label in self.labels:
            for spelling in [label, *self.label_aliases.get(label, [])]:
                mapping[normalize_label_key(spelling)] = label
        return mapping


def normalize_label_key(value: str) -> str:
    """Case-, space- and underscore-insensitive key, so 'Activate my card' matches 'activate_my_card'."""
    return " ".join(str(value).replace("_", " ").split()).casefold()
