"""Task specifications and prompt templates (data, not code).

Built-in tasks live in ``builtin/*.toml``; a user's task is a TOML/YAML file
with the same keys, loaded with ``get_task(path)``.
"""

from wasp_vllm.tasks.loader import get_task, list_tasks, load_task_file, task_from_dict
from wasp_vllm.tasks.prompts import build_prompt, draw_contrastive_examples, pick_attribute
from wasp_vllm.tasks.spec import PROMPT_KINDS, PromptTemplates, TaskError, TaskSpec, normalize_label_key
from wasp_vllm.tasks.writer import save_task

__all__ = [
    "PROMPT_KINDS",
    "PromptTemplates",
    "TaskError",
    "TaskSpec",
    "build_prompt",
    "draw_contrastive_examples",
    "get_task",
    "list_tasks",
    "load_task_file",
    "normalize_label_key",
    "pick_attribute",
    "save_task",
    "task_from_dict",
]
