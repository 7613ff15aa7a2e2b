"""wasp-vllm: differentially private synthetic text from several collaborating LLMs (WASP).

The Python API: :func:`generate` (returns a :class:`RunResult`), :func:`plan` (what a run will
release, ask and cost, before it runs) and :func:`evaluate`.
"""

from wasp_vllm.api import RunResult, evaluate, generate, plan

__version__ = "0.2.0"
__all__ = ["RunResult", "__version__", "evaluate", "generate", "plan"]
