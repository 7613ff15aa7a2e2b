"""wasp-vllm: differentially private synthetic text from several collaborating LLMs (WASP)."""

__version__ = "0.1.0"
