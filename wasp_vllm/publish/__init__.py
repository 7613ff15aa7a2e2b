"""Sharing a finished run: a folder of only its publishable files and its card, and the Hugging Face Hub."""

from wasp_vllm.publish.folder import PublishError, publish_run
from wasp_vllm.publish.hub import push_to_hub

__all__ = ["PublishError", "publish_run", "push_to_hub"]
