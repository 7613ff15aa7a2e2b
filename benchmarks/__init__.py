"""The benchmarks: performance (``benchmarks/*.py``), quality (``benchmarks/quality/``) and Hot PATE
(``benchmarks/hotpate/``), each script a module run from the repository root, e.g.
``python -m benchmarks.topq_search --quick`` (docs/benchmarks.md lists them all).

Importing the package sets what every benchmark runs with, before any of them imports
``wasp_vllm`` or a model library: the Hugging Face hub offline, tokenizers single-threaded, and
this checkout's model cache (``.cache``) unless ``WASP_VLLM_CACHE`` names another.
"""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WASP_VLLM_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))
