"""Character-level tokenizer for the synthetic tasks (a ``rlpost.tokenizer.Tokenizer``).

Ids: 0 = PAD, 1 = BOS, 2 = EOS, then one id per character of ``ALPHABET``. Encoding is
strict: a character outside the alphabet is an error naming it and its position.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlpost.tokenizer import Tokenizer, pad  # noqa: F401  (re-exported)

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
