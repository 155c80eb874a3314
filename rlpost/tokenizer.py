"""The tokenizer protocol of every policy, its one padder of id sequences, and the character
tokenizer of the built-in model.

``Tokenizer`` is what the trainer, the sampler's callers and the tasks need from a tokenizer:
prompt encoding (with the special tokens the model expects at the start), decoding, the pad id,
the ids that end a completion and the vocabulary size. ``CharTokenizer`` (the built-in model's,
below) and ``rlpost.models.hf.Tokenizer`` (a Hugging Face checkpoint's) implement it.

``CharTokenizer`` ids: 0 = PAD, 1 = BOS, 2 = EOS, then one id per character of ``ALPHABET``.
Encoding is strict: a character outside the alphabet is an error naming it and its position.
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


PAD, BOS, EOS = 0, 1, 2
ALPHABET = "0123456789+-*/=(),:;# abcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
  """Maps characters of ``alphabet`` to ids ``3 ..`` (0, 1, 2 are PAD, BOS, EOS)."""

  pad_id = PAD
  bos_id = BOS
  eos_id = EOS
  eos_ids = (EOS,)

  def __init__(self, alphabet: str = ALPHABET):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError("tokenizer alphabet has repeated characters")
    self.alphabet = alphabet
    self._to_id = {c: i + 3 for i, c in enumerate(alphabet)}
    self._lut = np.array(["", "", ""] + list(alphabet), dtype=object)

  @property
  def vocab_size(self) -> int:
    return len(self.alphabet) + 3

  def token_id(self, char: str) -> int:
    return self._to_id[char]

  def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
    ids = []
    for i, c in enumerate(text):
      if c not in self._to_id:
        raise ValueError(f"character {c!r} at position {i} of {text!r} is not in the tokenizer "
                         f"alphabet")
      ids.append(self._to_id[c])
    return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

  def encode_prompt(self, text: str) -> list[int]:
    """BOS and the characters of ``text``."""
    return self.encode(text, bos=True)

  def token_to_id(self, token: str) -> int | None:
    return self._to_id.get(token)

  def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True) -> str:
    """Text of ``ids``; PAD and BOS are dropped, decoding stops at the first EOS by default."""
    out = []
    for i in ids:
      i = int(i)
      if i == EOS and stop_at_eos:
        break
      if 3 <= i < self.vocab_size:
        out.append(self.alphabet[i - 3])
    return "".join(out)

  def encode_batch(self, texts: Sequence[str], length: int, *, bos: bool = False, eos: bool = False,
                   side: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Padded [B, length] int32 ids and [B, length] bool mask; errors name the offending row."""
    ids = []
    for r, text in enumerate(texts):
      try:
        ids.append(self.encode(text, bos=bos, eos=eos))
      except ValueError as e:
        raise ValueError(f"row {r}: {e}") from None
    return pad(ids, pad_id=PAD, length=length, side=side, what="row")
