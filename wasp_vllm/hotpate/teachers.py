"""Next-token distributions of all teachers at once, with each teacher's KV cache reused.

Hot PATE needs, for every generated token, the next-token distribution of every teacher
prompt (and of one public prompt for the fallback).  The public hot-pate code re-encodes every
teacher's whole prefix for every token - quadratic in the output length.  Here all teacher
prompts go through the model once, left-padded into one batch, and every later step feeds
only the one new (public) token to every row with ``past_key_values``: one decode step of
batch ``n`` per token.

Padding: prompts are left-padded so that every row's last position is its last real token;
position ids are counted over real tokens only (``cumsum(mask) - 1``), so a padded row sees
exactly the positions it would see alone (this matters for models with absolute positions;
for RoPE models it is a no-op up to rounding).  Padded to the batch's longest prompt, every row's
numbers would follow that length in their last bits (the kernels' rounding follows the shapes):
one private record could then move *another* teacher's distribution and flip a near-tie in its
coordinated draw.  ``pad_to`` pads every row to a length fixed by public settings
(:func:`public_pad_length`) instead; the batch's shape is then public and each row's numbers
depend on its own prompt alone, bitwise.  A prompt longer than that (text of fewer than
``CHARS_PER_TOKEN_FLOOR`` characters per token) loses its first tokens: a function of its own
records still.

Several records are generated from the same teacher prompts, so :meth:`TeacherEnsembleLM.reset`
goes back to the state right after the prompts from a pristine copy of the prefill cache: the
prompts are encoded once per ensemble, not once per record.

vLLM.  :mod:`wasp_vllm.hotpate.vllm_teachers` serves the same :class:`DistributionSource` from
vLLM, which exposes only each request's top-``K`` log-probabilities: the mass outside them becomes
an explicit "no token" bin that the selector never returns (the argument is in that module).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from wasp_vllm.engines.devices import torch_device
from wasp_vllm.hotpate.ensembles import is_tensor, on_host
from wasp_vllm.hotpate.prompts import CHARS_PER_TOKEN_FLOOR

log = logging.getLogger(__name__)


class DistributionSource(Protocol):
    """What Hot PATE generation needs from a model: one distribution per row, one token at a time.

    Rows are the prompts the source was built with (teachers, then the public prompt);
    ``append`` adds the same public token to every row; ``reset`` goes back to the prompts.
    """

    n_rows: int
    stop_token_ids: frozenset[int]

    @property
    def vocab_size(self) -> int: ...

    def next_distributions(self) -> Any: ...  # an array, or a tensor left on a GPU

    def append(self, token_id: int) -> None: ...

    def reset(self) -> None: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def encode(self, text: str) -> list[int]: ...


class WithPublicRow:
    """The teachers' rows from one source and the public prompt's row from another, read as one
    source (the public row last).

    The public row drives the fallback, whose tokens are spent as public (no privacy).  In one
    padded batch with the teacher prompts its distribution could depend, in its last bits, on a
    private prompt's length (the batch is padded to the longest prompt, and the kernels' rounding
    follows the shapes); with forward passes of its own it depends on the public prompt alone.
    """

    def __init__(self, teachers: DistributionSource, public: DistributionSource) -> None:
        self.teachers, self.public = teachers, public
        self.n_rows = teachers.n_rows + public.n_rows
        self.stop_token_ids = public.stop_token_ids
        if hasattr(public, "no_token_id"):  # vLLM's top-K rows (see vllm_teachers)
            self.no_token_id = public.no_token_id

    @property
    def vocab_size(self) -> int:
        return self.public.vocab_size

    def next_distributions(self) -> Any:
        teachers, public = self.teachers.next_distributions(), self.public.next_distributions()
        if is_tensor(teachers):  # rows left on a GPU: stack them there
            import torch

            return torch.cat([teachers, torch.as_tensor(public, device=teachers.device)])
        return np.vstack([teachers, on_host(public)])

    def append(self, token_id: int) -> None:
        self.teachers.append(token_id)
        self.public.append(token_id)

    def reset(self) -> None:
        self.teachers.reset()
        self.public.reset()

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.public.decode(token_ids)

    def encode(self, text: str) -> list[int]:
        return self.public.encode(text)


@dataclass
class LoadedLM:
    """A causal LM and its tokenizer, loaded once and shared by every ensemble built on it."""

    model: Any
    tokenizer: Any
    device: Any
    chat: bool
    name: str


def _default_dtype(device: Any) -> Any:
    """bf16 on GPUs; fp32 on CPU, where bf16 matmuls are slower here and less exact."""
    import torch

    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_lm(
    model: str | Path, device: str | None = None, dtype: Any = None, chat: bool | None = None
) -> LoadedLM:
    """Load a model directory, or a PLM preset name resolved with the engine registry."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, name, preset_chat = _resolve(model)
    dev = torch.device(torch_device(device))
    dt = dtype if dtype is not None else _default_dtype(dev)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dt).to(dev).eval()  # type: ignore[arg-type]
    use_chat = bool(preset_chat if chat is None else chat)
    if use_chat and getattr(tokenizer, "chat_template", None) is None:
        use_chat = False
    log.info("hot pate: loaded %s on %s (%s, chat=%s)", name, dev, dt, use_chat)
    return LoadedLM(lm, tokenizer, dev, use_chat, name)


def _resolve(model: str | Path) -> tuple[Path, str, bool | None]:
    path = Path(model).expanduser()
    if path.is_dir():
        return path, path.name, None
    from wasp_vllm.engines.registry import resolve_plm

    resolved = resolve_plm(str(model))
    return resolved.path, resolved.name, resolved.chat


def stop_ids(tokenizer: Any, generation_eos: Any = None) -> frozenset[int]:
    """End-of-sequence ids: the tokenizer's, the generation config's and chat end-of-turn markers."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, generation_eos):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in ("<|im_end|>", "<end_of_turn>", "<|endoftext|>", "<|eot_id|>") if t in vocab)
    return frozenset(ids)


def format_prompts(tokenizer: Any, prompts: Sequence[str], chat: bool) -> list[str]:
    """Each prompt as a user turn of the chat template (chat models), else as is."""
    if not chat:
        return list(prompts)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]


def public_pad_length(lm: LoadedLM, skeletons: Sequence[str], examples: int, max_example_chars: int) -> int:
    """The padded length of a teacher batch, from public facts only.

    ``skeletons``: the teacher prompts with empty examples (one per label, public); each of the
    ``examples`` slots holds at most ``max_example_chars`` characters, counted at
    ``CHARS_PER_TOKEN_FLOOR`` characters per token (plus two for the join).
    """
    formatted = format_prompts(lm.tokenizer, skeletons, lm.chat)
    fixed = max(map(len, encode_prompts(lm.tokenizer, formatted, lm.chat)))
    return fixed + examples * (math.ceil(max_example_chars / CHARS_PER_TOKEN_FLOOR) + 2)


def encode_prompts(tokenizer: Any, texts: Sequence[str], chat: bool) -> list[list[int]]:
    """Token ids of formatted prompts: a chat template writes its special tokens, a plain prompt gets BOS."""
    return [list(tokenizer(t, add_special_tokens=not chat).input_ids) for t in texts]


class TeacherEnsembleLM:
    """All teacher prompts in one batch; the same public token appended to every teacher.

    ``next_distributions()`` returns ``[n_rows, vocab]`` float32 probabilities (temperature
    applied); ``append(token_id)`` advances every row by that token with one decode step.
    ``chat`` (default: the model's) wraps each prompt as a user turn of the chat template.
    ``on_device`` (default: off the CPU) returns them as a tensor left on the model's device, for
    the coordinated draw to run there (see ``ensembles.DeviceCoordinatedEnsemble``).
    Prompt texts are private: they are never logged.
    """

    def __init__(
        self,
        model_path: str | Path | LoadedLM,
        teacher_prompts: Sequence[str],
        device: str | None = None,
        dtype: Any = None,
        temperature: float = 1.0,
        chat: bool | None = None,
        pad_to: int | None = None,
        on_device: bool | None = None,
    ) -> None:
        if not teacher_prompts:
            raise ValueError("TeacherEnsembleLM needs at least one prompt")
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.lm = model_path if isinstance(model_path, LoadedLM) else load_lm(model_path, device, dtype, chat)
        # chat=False uses a chat model as a plain LM (the prompt is the raw text to continue).
        self.chat = self.lm.chat if chat is None else bool(chat and self.lm.chat)
        self.temperature = float(temperature)
        self.on_device = self.lm.device.type != "cpu" if on_device is None else on_device
        self.n_rows = len(teacher_prompts)
        generation_eos = getattr(self.lm.model.generation_config, "eos_token_id", None)
        self.stop_token_ids = stop_ids(self.lm.tokenizer, generation_eos)
        self.generated: list[int] = []
        self._prefill(self._format(teacher_prompts), pad_to)

    # -- prompts ------------------------------------------------------------------------------

    def _format(self, prompts: Sequence[str]) -> list[str]:
        """Wrap each prompt as a user turn when the model is a chat model."""
        return format_prompts(self.lm.tokenizer, prompts, self.chat)

    def _prefill(self, texts: list[str], pad_to: int | None) -> None:
        """Encode every prompt once; keep a pristine copy of the cache for :meth:`reset`."""
        import torch

        tok = self.lm.tokenizer
        sides = tok.padding_side, tok.truncation_side
        tok.padding_side = tok.truncation_side = "left"
        # A public length for rows that share a batch (see the module's docstring).
        fixed = {"padding": "max_length", "max_length": pad_to, "truncation": True}
        try:
            # A chat template already writes the special tokens; a plain prompt needs BOS.
            enc = tok(texts, return_tensors="pt", add_special_tokens=not self.chat,
                      **(fixed if pad_to is not None and len(texts) > 1 else {"padding": True}))  # fmt: skip
        finally:
            tok.padding_side, tok.truncation_side = sides
        mask = enc.attention_mask.to(self.lm.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            out = self.lm.model(
                input_ids=enc.input_ids.to(self.lm.device),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
        self._pristine = (out.past_key_values, mask, positions[:, -1:], out.logits[:, -1, :].float())
        self.prompt_lengths = mask.sum(-1).tolist()
        self.reset()

    # -- stepping -----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self._logits.shape[-1])

    def reset(self) -> None:
        """Back to the state right after the prompts (the cache is copied lazily on append)."""
        _, self._mask, self._last_pos, self._logits = self._pristine
        self._cache = None
        self.generated = []

    def next_distributions(self) -> Any:
        """``softmax(logits / temperature)`` of every row at the current position."""
        import torch

        probs = torch.softmax(self._logits / self.temperature, dim=-1)
        return probs if self.on_device else probs.cpu().numpy()

    def append(self, token_id: int) -> None:
        """Feed the same token to every row, reusing each row's KV cache."""
        import torch

        if not 0 <= int(token_id) < self.vocab_size:
            raise ValueError("token id outside the vocabulary")
        if self._cache is None:
            self._cache = copy.deepcopy(self._pristine[0])
        dev = self.lm.device
        ids = torch.full((self.n_rows, 1), int(token_id), dtype=torch.long, device=dev)
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=-1)
        self._last_pos = self._last_pos + 1
        with torch.inference_mode():
            out = self.lm.model(
                input_ids=ids,
                attention_mask=self._mask,
                position_ids=self._last_pos,
                past_key_values=self._cache,
                use_cache=True,
            )
        self._cache = out.past_key_values
        self._logits = out.logits[:, -1, :].float()
        self.generated.append(int(token_id))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.lm.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of a public text (no special tokens), e.g. to force a prefix."""
        return list(self.lm.tokenizer(text, add_special_tokens=False).input_ids)
