"""``python -m wasp_vllm`` runs the CLI (guarded: vLLM's CPU workers re-import __main__)."""

from wasp_vllm.cli import app

if __name__ == "__main__":
    app()
