"""Hugging Face tokenizers: ``tokenizer.json`` (through ``tokenizers``) with the special ids of
its checkpoint, the character tokenizer written in that format, and the tokenizer files a
checkpoint carries.

``load_tokenizer`` returns a ``Tokenizer`` (an ``rlpost.tokenizer.Tokenizer``);
``special_token_ids`` reads a checkpoint's bos / eos / pad ids as config.json keys;
``write_char_tokenizer`` writes a ``rlpost.tokenizer.CharTokenizer`` so that ``transformers``'
``AutoTokenizer`` encodes prompts to its ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlpost import tokenizer
from rlpost.models.hf.config import CONFIG_NAME, read_json

# The files of a checkpoint's tokenizer (those present are copied by ``save_pretrained(source=)``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A ``tokenizers.Tokenizer`` with the special ids of its checkpoint.

  Attributes:
    backend: the underlying ``tokenizers.Tokenizer``.
    eos_ids: ids that end generation (generation_config.json first, then tokenizer_config.json,
      then config.json; deduplicated, in that order).
    pad_id: padding id (tokenizer_config.json ``pad_token``, else generation_config.json /
      config.json ``pad_token_id``, else the first eos id, else None).
    bos_id: beginning-of-sequence id or None.
  """

  backend: Any
  eos_ids: tuple[int, ...]
  pad_id: int | None
  bos_id: int | None

  @property
  def vocab_size(self) -> int:
    """Size of the vocabulary including added tokens."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of one string."""
    return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_prompt(self, text: str) -> list[int]:
    """Ids of a prompt with the checkpoint's own special tokens (``add_special_tokens``)."""
    return self.encode(text)

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    """String of one id sequence (list or 1-D array)."""
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def encode_batch(self, texts: Sequence[str], *,
                   add_special_tokens: bool = True) -> list[list[int]]:
    return [e.ids for e in self.backend.encode_batch(list(texts),
                                                     add_special_tokens=add_special_tokens)]

  def decode_batch(self, batch: Sequence[Sequence[int]], *,
                   skip_special_tokens: bool = True) -> list[str]:
    return self.backend.decode_batch([[int(i) for i in ids] for ids in batch],
                                     skip_special_tokens=skip_special_tokens)

  def pad(self, batch: Sequence[Sequence[int]], *, length: int | None = None,
          side: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Pad id sequences to a fixed length.

    Returns (tokens [B, length] int32, mask [B, length] bool); ``length`` defaults to the
    longest sequence. ``side`` is "left" (prompts for sampling) or "right". Raises ValueError if
    a sequence is longer than ``length`` or the tokenizer has no pad id.
    """
    if self.pad_id is None:
      raise ValueError("tokenizer has no pad id (no pad_token, pad_token_id or eos)")
    return tokenizer.pad(batch, pad_id=self.pad_id, length=length, side=side)

  def encode_padded(self, texts: Sequence[str], *, length: int | None = None,
                    side: str = "left",
                    add_special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``pad(encode_batch(texts))``: (tokens [B, length] int32, mask [B, length] bool)."""
    return self.pad(self.encode_batch(texts, add_special_tokens=add_special_tokens),
                    length=length, side=side)


def _token_content(token) -> str | None:
  if isinstance(token, dict):
    return token.get("content")
  return token


def _as_id_list(value) -> list[int]:
  if value is None:
    return []
  if isinstance(value, (list, tuple)):
    return [int(v) for v in value]
  return [int(value)]


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """Load ``tokenizer.json`` from a checkpoint directory (or the file itself).

  Special ids are read from tokenizer_config.json, generation_config.json and config.json when
  present next to it. Raises FileNotFoundError if tokenizer.json is missing (checkpoints with
  only a SentencePiece ``tokenizer.model`` must be converted first, e.g. by re-saving with
  transformers' fast tokenizer).
  """
  import tokenizers

  path = Path(path)
  file = path if path.is_file() else path / "tokenizer.json"
  folder = file.parent
  if not file.exists():
    raise FileNotFoundError(f"{file} not found (a tokenizers-format tokenizer.json is required)")
  backend = tokenizers.Tokenizer.from_file(str(file))

  def read_optional(name: str) -> dict:
    p = folder / name
    return read_json(p) if p.exists() else {}

  tok_cfg = read_optional("tokenizer_config.json")
  gen_cfg = read_optional("generation_config.json")
  model_cfg = read_optional(CONFIG_NAME)

  def token_id(key: str) -> int | None:
    content = _token_content(tok_cfg.get(key))
    if content is None:
      return None
    tid = backend.token_to_id(content)
    if tid is None:
      raise ValueError(f"tokenizer_config.json {key} {content!r} is not in the vocabulary of "
                       f"{file}")
    return tid

  eos: list[int] = []
  for ids in (_as_id_list(gen_cfg.get("eos_token_id")), _as_id_list(token_id("eos_token")),
              _as_id_list(model_cfg.get("eos_token_id"))):
    eos += [i for i in ids if i not in eos]
  pad = token_id("pad_token")
  for cfg in (gen_cfg, model_cfg):
    if pad is None and cfg.get("pad_token_id") is not None:
      pad = _as_id_list(cfg["pad_token_id"])[0]
  if pad is None and backend.padding is not None:
    pad = backend.padding.get("pad_id")
  if pad is None and eos:
    pad = eos[0]
  bos = token_id("bos_token")
  for cfg in (gen_cfg, model_cfg):
    if bos is None and cfg.get("bos_token_id") is not None:
      bos = _as_id_list(cfg["bos_token_id"])[0]
  return Tokenizer(backend=backend, eos_ids=tuple(eos), pad_id=pad, bos_id=bos)


# Names of the character tokenizer's special ids in its Hugging Face files.
CHAR_SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>"}


def write_char_tokenizer(tok, folder: str | os.PathLike, *,
                         model_max_length: int | None = None) -> list[Path]:
  """Write a character tokenizer (``rlpost.tokenizer.CharTokenizer``) in the files of a
  Hugging Face fast tokenizer: tokenizer.json, tokenizer_config.json, special_tokens_map.json.

  ``AutoTokenizer.from_pretrained(folder)`` (and ``load_tokenizer``) then encode a prompt to
  ``tok.encode_prompt``'s ids: BOS, then one id per character (a ``WordLevel`` model over the
  alphabet, every character its own pre-token), and decode ids back to the characters. The pad,
  bos and eos ids keep their numbers under the names ``CHAR_SPECIAL_TOKENS``. A character
  outside the alphabet fails to encode (the vocabulary has no unknown token), as with ``tok``.

  Args:
    tok: has ``alphabet`` (character i is id ``3 + i``) and ``pad_id`` / ``bos_id`` /
      ``eos_id``.
    folder: an existing directory.
    model_max_length: the longest sequence, for tokenizer_config.json (None: unset).

  Returns the paths written.
  """
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors

  names = CHAR_SPECIAL_TOKENS
  clash = sorted(name for name in names.values() if set(name) <= set(tok.alphabet))
  if clash:
    raise ValueError(f"the tokenizer alphabet can spell the special token names {clash}")
  ids = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id}
  vocab = {names[k]: int(i) for k, i in ids.items()}
  vocab.update({c: tok.token_to_id(c) for c in tok.alphabet})
  backend = tokenizers.Tokenizer(models.WordLevel(vocab))
  backend.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
  backend.decoder = decoders.Fuse()
  backend.add_special_tokens([tokenizers.AddedToken(names[k], special=True, normalized=False)
                              for k in ("pad", "bos", "eos")])
  backend.post_processor = processors.TemplateProcessing(
      single=f"{names['bos']} $A", pair=f"{names['bos']} $A $B",
      special_tokens=[(names["bos"], ids["bos"])])
  folder = Path(folder)
  special = {"bos_token": names["bos"], "eos_token": names["eos"], "pad_token": names["pad"]}
  tok_cfg = dict(special, tokenizer_class="PreTrainedTokenizerFast", padding_side="left",
                 clean_up_tokenization_spaces=False, add_bos_token=True, add_eos_token=False)
  if model_max_length is not None:
    tok_cfg["model_max_length"] = int(model_max_length)
  backend.save(str(folder / "tokenizer.json"))
  for name, data in (("tokenizer_config.json", tok_cfg), ("special_tokens_map.json", special)):
    with open(folder / name, "w") as f:
      json.dump(data, f, indent=2, sort_keys=True)
  return [folder / n for n in ("tokenizer.json", "tokenizer_config.json",
                               "special_tokens_map.json")]


def special_token_ids(path: str | os.PathLike) -> dict[str, int | list[int]]:
  """The bos / eos / pad ids of the checkpoint directory ``path``, as config.json keys.

  config.json's ``bos_token_id``, ``eos_token_id`` (an int or a list) and ``pad_token_id`` are
  kept as they are; a key it lacks is taken from the tokenizer (``load_tokenizer``: tokenizer,
  generation and model configs) when ``path`` has a tokenizer.json. Keys with no id are left out.
  """
  path = Path(path)
  cfg = read_json(path / CONFIG_NAME)
  out = {k: cfg[k] for k in SPECIAL_ID_KEYS if cfg.get(k) is not None}
  if len(out) < len(SPECIAL_ID_KEYS) and (path / "tokenizer.json").exists():
    tok = load_tokenizer(path)
    eos = list(tok.eos_ids)
    found = {"bos_token_id": tok.bos_id, "pad_token_id": tok.pad_id,
             "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else None}
    out.update({k: v for k, v in found.items() if k not in out and v is not None})
  return out
