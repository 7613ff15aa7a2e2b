"""A commented task file to start a custom task from (``wasp-vllm tasks --template NAME``).

The text is valid as written (a test loads it with the task loader): a user edits the labels and
the wording, not the structure.  Placeholders in braces are filled by the pipeline; every prompt
ends on an opening quote, so the model's continuation is the sample and it stops at the closing one.
"""

from __future__ import annotations

import re
from pathlib import Path

from wasp_vllm.tasks.spec import TaskError

TEMPLATE = """\
# A wasp-vllm task: what the private records are and how the PLMs are asked for new ones.
# Use it with: wasp-vllm generate --task {file} --private YOUR_FILE.csv ...
# Check it with: wasp-vllm tasks --check {file}

# Lower case letters, digits and underscores.
name = "{name}"
description = "One line on what the texts are (shown in the data set's card)."

# The labels, exactly as your file's label column spells them (or see label_aliases below).
labels = ["label_a", "label_b"]

# Recommended: a public attribute that varies the prompts within a label, e.g. a few sub-topics
# per label that you write yourself (never copied from your records).  Without one, nothing but the
# label varies the prompts; with one, every method wrote better data on each set measured (+0.06
# macro-F1 on a five-topic news set).  Each prompt then asks for one value, written into it as
# {{attribute_text}} by attribute_template.  Uncomment the two lines below and the table
# label_attribute_values further down (or give one list for all labels as attribute_values).
# attribute_name = "topic"
# attribute_template = " about {{attribute}}"

# Optional: other spellings in your file that mean the same label (matched ignoring case, spaces
# and underscores).  Every label of the file must be a label or an alias, or the run stops.
[label_aliases]
label_a = ["a", "first"]
label_b = ["b", "second"]

# Optional: how a prompt names each label ({{label_text}}); default: the label, '_' read as ' '.
[label_descriptions]
label_a = "the first kind"
label_b = "the second kind"

# The attribute's values per label (with attribute_name above).
# [label_attribute_values]
# label_a = ["a first sub-topic", "a second sub-topic", "a third sub-topic"]
# label_b = ["another sub-topic", "and another", "and a third"]

# The three prompts of WASP.  {{label_text}} is the label's description above; in round 0 the PLMs
# see the zero-shot prompt; later rounds show synthetic samples the private records voted for:
# {{examples}} (few_shot, the default) or {{good_examples}} and {{bad_examples}} (contrastive).
# Each prompt must end on an opening double quote and no space after it: the sample is what the
# model writes next, up to the closing quote.
[templates]
zero_shot = \'\'\'A text of the {name} task{{attribute_text}} that is {{label_text}}: "\'\'\'
few_shot = \'\'\'{{examples}}
Another text of the {name} task{{attribute_text}} that is {{label_text}}, different from the ones above: "\'\'\'
contrastive = \'\'\'{{bad_examples}}
{{good_examples}}
A new text of the {name} task{{attribute_text}} that is {{label_text}}, closer to the good ones than to the bad ones: "\'\'\'
# How one synthetic sample is shown inside the prompts above ({{text}} is the sample).
example = \'\'\'A text that is {{label_text}}: "{{text}}"\'\'\'
good_example = \'\'\'A good text that is {{label_text}}: "{{text}}"\'\'\'
bad_example = \'\'\'A bad text: "{{text}}"\'\'\'
"""  # noqa: E501 (a prompt is one line of the file)


def task_template(name: str, file: str | None = None) -> str:
    """The commented task file for a task called ``name``."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_]*", name):
        raise TaskError(f"task name {name!r}: use lower case letters, digits and underscores, e.g. 'tickets'")
    return TEMPLATE.format(name=name, file=file or f"{name}.toml")


def write_task_template(name: str, path: str | Path | None = None) -> Path:
    """Write :func:`task_template` to ``path`` (default ``NAME.toml`` here); an existing file is kept."""
    target = Path(path) if path is not None else Path(f"{name}.toml")
    if target.suffix.lower() != ".toml":
        raise TaskError(f"{target}: a task template is written as .toml")
    if target.exists():
        raise TaskError(f"{target} exists and is kept: choose another path with --out")
    target.write_text(task_template(name, str(target)), encoding="utf-8")
    return target
