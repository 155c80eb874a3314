"""A ``Policy``: the model split into graph and parameters, its tokenizer, stop and pad ids.

Two constructors give the same thing: ``Policy.character`` (the built-in character-level decoder,
freshly initialised) and ``Policy.from_hf`` (a local Hugging Face checkpoint: config.json,
safetensors, tokenizer.json). Everything downstream (sampling, log-probs, the trainer) reads only
the bundle's fields.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from flax import nnx

from rlpost.models import transformer as tfm
from rlpost.tokenizer import CharTokenizer, Tokenizer


@dataclasses.dataclass(frozen=True)
class Policy:
  """Attributes:
    graphdef: ``nnx.split`` graph of the model (static).
    params: its parameter state (a pytree of arrays).
    tokenizer: a ``Tokenizer`` (encode_prompt, decode, pad_id, eos_ids, vocab_size).
    stop_tokens: ids that end a completion (the tokenizer's eos ids plus any extra stop tokens).
    pad_id: the prompt and completion padding id.
    model_cfg: the ``TransformerConfig``.
  """

  graphdef: Any
  params: Any
  tokenizer: Tokenizer
  stop_tokens: tuple[int, ...]
  pad_id: int
  model_cfg: tfm.TransformerConfig

  @classmethod
  def from_model(cls, model: tfm.Transformer, tokenizer: Tokenizer,
                 stop_tokens: Sequence[int] | None = None) -> "Policy":
    graphdef, params = nnx.split(model)
    stops = tuple(dict.fromkeys(stop_tokens if stop_tokens is not None else tokenizer.eos_ids))
    return cls(graphdef, params, tokenizer, stops, tokenizer.pad_id, model.cfg)

  @classmethod
  def character(cls, model_cfg: tfm.TransformerConfig, *, seed: int = 0) -> "Policy":
    """The built-in character-level decoder, randomly initialised (``tfm.init_model``)."""
    return cls.from_model(tfm.init_model(model_cfg, seed=seed), CharTokenizer())

  @classmethod
  def from_hf(cls, path: str, **kw) -> "Policy":
    """A Hugging Face checkpoint directory and its tokenizer (``load_hf``'s arguments)."""
    return cls.from_model(*load_hf(path, **kw))

  def model(self) -> tfm.Transformer:
    """The module (``nnx.merge``), e.g. to fine-tune it in place."""
    return nnx.merge(self.graphdef, self.params)

  def replace(self, **changes) -> "Policy":
    return dataclasses.replace(self, **changes)


def load_hf(path: str, *, dtype: str = "float32", param_dtype: str | None = None,
            max_seq_len: int | None = None, extra_stop_tokens: Sequence[str] = (),
            attention: str = "xla", stacked_layers: bool = False,
            what: str = "config key 'policy'") -> tuple[tfm.Transformer, Tokenizer, tuple]:
  """(the module, its tokenizer, its stop tokens: eos ids plus ``extra_stop_tokens``) of a Hugging
  Face checkpoint directory, checked against each other; errors name ``what`` and ``path``.
  ``Policy.from_model(*load_hf(path))`` is ``Policy.from_hf(path)``."""
  from rlpost.models import hf

  if not os.path.isdir(path):
    raise FileNotFoundError(f"{what}: {path} is not a directory (expected a Hugging Face "
                            "checkpoint: config.json, *.safetensors, tokenizer.json)")
  try:
    tok = hf.load_tokenizer(path)
    model = hf.load_pretrained(path, dtype=dtype, param_dtype=param_dtype, attention=attention,
                               stacked_layers=stacked_layers)
  except (FileNotFoundError, ValueError) as e:
    raise type(e)(f"{what} ({path}): {e}") from None
  if not tok.eos_ids:
    raise ValueError(f"{what} ({path}): the tokenizer has no eos token id "
                     "(tokenizer_config.json eos_token, or eos_token_id in "
                     "generation_config.json / config.json); generation could never stop")
  if tok.vocab_size > model.cfg.vocab_size:
    raise ValueError(f"{what} ({path}): the tokenizer has {tok.vocab_size} tokens "
                     f"but the model's vocab_size is {model.cfg.vocab_size}")
  if max_seq_len is not None:
    model.cfg = model.cfg.replace(max_seq_len=int(max_seq_len))
  extra = []
  for s in extra_stop_tokens:
    tid = tok.token_to_id(s)
    if tid is None:
      raise ValueError(f"config key 'extra_stop_tokens': {s!r} is not a token of {path}")
    extra.append(tid)
  return model, tok, (*tok.eos_ids, *extra)
