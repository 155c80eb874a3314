"""The tokenizer protocol of every policy, and the one padder of id sequences.

``Tokenizer`` is what the trainer, the sampler's callers and the tasks need from a tokenizer:
prompt encoding (with the special tokens the model expects at the start), decoding, the pad id,
the ids that end a completion and the vocabulary size. ``rlpost.tasks.tokenizer.CharTokenizer``
(the built-in model's) and ``rlpost.models.hf.Tokenizer`` (a Hugging Face checkpoint's)
implement it.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Tokenizer(Protocol):
  """What rlpost needs from a policy's tokenizer."""

  pad_id: int
  eos_ids: tuple[int, ...]

  @property
  def vocab_size(self) -> int: ...

  def encode_prompt(self, text: str) -> list[int]:
    """Ids of a prompt, with the special tokens the model expects at the start."""

  def decode(self, ids: Sequence[int]) -> str:
    """Text of completion ids (special tokens dropped)."""

  def token_to_id(self, token: str) -> int | None:
    """The id of one token string, or None."""


def pad(seqs: Sequence[Sequence[int]], *, pad_id: int, length: int | None = None,
        side: str = "left", what: str = "sequence",
        allow_empty: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Id sequences packed into a padded buffer (host side).

  Returns (tokens [B, length] int32, mask [B, length] bool); ``length`` defaults to the longest
  sequence; ``side`` "left" (prompts for sampling) or "right". Errors name the ``what`` index
  that does not fit (or is empty when ``allow_empty`` is False).
  """
  if side not in ("left", "right"):
    raise ValueError(f"side must be 'left' or 'right', got {side!r}")
  if len(seqs) == 0:
    raise ValueError(f"empty batch: no {what}s given")
  longest = max(len(s) for s in seqs)
  length = longest if length is None else length
  tokens = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), bool)
  for i, ids in enumerate(seqs):
    n = len(ids)
    if n > length:
      raise ValueError(f"{what} {i} has {n} tokens and does not fit the buffer length {length}")
    if n == 0 and not allow_empty:
      raise ValueError(f"{what} {i} is empty")
    sl = slice(length - n, length) if side == "left" else slice(0, n)
    tokens[i, sl] = ids
    mask[i, sl] = True
  return tokens, mask
