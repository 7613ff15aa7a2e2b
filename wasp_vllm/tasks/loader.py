"""Finding and reading task files: the built-in ones by name, a user's by path (TOML or YAML),
validated into a :class:`~wasp_vllm.tasks.spec.TaskSpec` with errors that name the file and key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from wasp_vllm.tasks.spec import BUILTIN_DIR, TASK_FILE_SUFFIXES, TaskError, TaskSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    try:
        import tomli as tomllib
    except ImportError:  # tomli is optional there; TOML task files then need it
        tomllib = None


def _builtin_files() -> dict[str, Path]:
    return {path.stem: path for path in sorted(BUILTIN_DIR.glob("*.toml"))}


def list_tasks() -> list[str]:
    """Names of the built-in tasks (the stems of ``builtin/*.toml``)."""
    return sorted(_builtin_files())


def _read_mapping(path: Path) -> dict[str, Any]:
    """Parse a TOML/YAML task file into a dict, with errors that name the file."""
    suffix = path.suffix.lower()
    if suffix not in TASK_FILE_SUFFIXES:
        raise TaskError(
            f"task file {path}: unsupported extension {suffix!r}; use one of {TASK_FILE_SUFFIXES}"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TaskError(f"task file {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        if suffix == ".toml":
            if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
                raise TaskError("reading TOML task files on Python 3.10 needs the 'tomli' package")
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = yaml.safe_load(raw.decode("utf-8"))
    except TaskError:
        raise
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise TaskError(f"task file {path}: invalid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise TaskError(
            f"task file {path}: the top level must be a mapping of keys, got {type(data).__name__}"
        )
    return data


def _format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown key (extra keys are not allowed)")
        else:
            parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def task_from_dict(data: dict[str, Any], source: str = "<dict>") -> TaskSpec:
    """Validate a mapping into a TaskSpec, turning pydantic errors into one readable TaskError."""
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"task {source}: {_format_validation_error(exc)}") from None


def load_task_file(path: str | Path) -> TaskSpec:
    """Load and validate one task file (.toml, .yaml or .yml)."""
    path = Path(path)
    if path.suffix.lower() not in TASK_FILE_SUFFIXES:
        raise TaskError(f"task file {path}: unsupported extension; use one of {TASK_FILE_SUFFIXES}")
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    return task_from_dict(_read_mapping(path), source=f"file {path}")


def looks_like_task_file(name_or_path: str) -> bool:
    """Whether ``--task`` names a file (a custom task) rather than a built-in task."""
    if "/" in name_or_path or "\\" in name_or_path:
        return True
    return Path(name_or_path).suffix.lower() in TASK_FILE_SUFFIXES


def get_task(name_or_path: str) -> TaskSpec:
    """A built-in task by name ('imdb', 'Yelp-Rating', ...) or a task file by path."""
    if looks_like_task_file(name_or_path):
        return load_task_file(name_or_path)
    key = name_or_path.strip().lower().replace("-", "_")
    files = _builtin_files()
    if key not in files:
        raise TaskError(
            f"unknown task {name_or_path!r}; built-in tasks: {', '.join(sorted(files))} "
            "(or give the path of a .toml/.yaml task file)"
        )
    return load_task_file(files[key])
