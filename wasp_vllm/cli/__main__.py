"""``python -m wasp_vllm.cli``; guarded, because vLLM's CPU workers re-import the entry module."""

import sys

from wasp_vllm.cli import app

if __name__ == "__main__":
    sys.exit(app())
