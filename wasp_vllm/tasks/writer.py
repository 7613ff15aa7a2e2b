"""Writing a task back to a file: TOML (a small writer, since tomllib only reads) or YAML."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from wasp_vllm.tasks.spec import TaskError, TaskSpec


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    # JSON string escapes (\", \\, \n, \uXXXX) are all valid TOML basic-string escapes.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_toml(data: dict[str, Any]) -> str:
    """TOML text for a task mapping (scalars, lists and one level of tables)."""
    head = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()]
            tables.append("\n".join([f"[{_toml_key(key)}]", *lines]))
    return "\n\n".join(["\n".join(head), *tables]) + "\n"


def save_task(task: TaskSpec, path: str | Path) -> Path:
    """Write ``task`` as TOML or YAML (by extension), e.g. to start a custom task from a built-in one."""
    path = Path(path)
    data = task.model_dump(exclude_none=True)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        text = dump_toml(data)
    elif suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)
    else:
        raise TaskError(f"cannot save task to {path}: use a .toml, .yaml or .yml file")
    path.write_text(text, encoding="utf-8")
    return path
