"""Hugging Face checkpoint interop: ``config.json`` + safetensors + ``tokenizer.json``.

Reads and writes the on-disk format of the ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
``LlamaForCausalLM`` (``attention_bias`` included), ``MistralForCausalLM`` and
``Gemma3ForCausalLM`` (Gemma 3 text) checkpoints, so that a model trained here loads in
``transformers.AutoModelForCausalLM.from_pretrained`` and vice versa. Only the ``hf`` extra (``safetensors``, ``tokenizers``) is needed; torch and
transformers are never imported.

Public API:
  config_from_hf(hf_config)                     -> TransformerConfig
  config_to_hf(config, architecture=None)       -> dict (config.json contents)
  architecture_for(config)                      -> the short name a config exports as
  load_pretrained(path, dtype=, param_dtype=)   -> Transformer
  save_pretrained(model, path, architecture=None, source=, eos_token_id=, ...)
  special_token_ids(path)                       -> {"bos_token_id", "eos_token_id", "pad_token_id"}
  load_tokenizer(path)                          -> Tokenizer
  read_json(path)                               -> dict (a JSON object; errors name the file)
  write_char_tokenizer(tok, folder)             -> [paths] (a CharTokenizer for transformers)

Weight layout: Hugging Face ``nn.Linear`` weights are ``[out, in]``; the NNX ``Linear`` kernels
here are ``[in, out]``, so projection weights are transposed on the way in and out. Embedding
``[V, E]`` and norm ``[E]`` tensors keep their layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from rlpost.models.transformer import (LinearRopeScaling, Llama3RopeScaling, Transformer,
                                       TransformerConfig)
from rlpost import tokenizer

# Short architecture names accepted by ``config_to_hf`` / ``save_pretrained``.
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "gemma3": "Gemma3ForCausalLM"}
_CLASSES = {v: k for k, v in ARCHITECTURES.items()}
# config.json ``model_type`` of each short name.
MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "mistral": "mistral",
               "gemma3": "gemma3_text"}
_SHORT_OF_TYPE = {v: k for k, v in MODEL_TYPES.items()}
# Families whose norms, activation and embedding follow Gemma (``_GEMMA`` options).
_GEMMA = dict(norm_plus_one=True, sandwich_norm=True, mlp_activation="gelu_tanh",
              embed_scale=True, qk_norm=True)

# The files of a checkpoint's tokenizer (those present are copied by ``save_pretrained(source=)``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"

# Tensors that some exporters write but that carry no parameters of this model.
_HARMLESS_TENSORS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")

_NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
              "float16": np.dtype(np.float16)}


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------

def architecture_of(hf: dict) -> str:
  """Short architecture name (a key of ``ARCHITECTURES``) from a config.json's
  ``architectures`` or ``model_type``."""
  archs = hf.get("architectures")
  if archs:
    if isinstance(archs, str):
      archs = [archs]
    arch = archs[0]
    if arch not in _CLASSES:
      hint = (" (the multimodal Gemma 3; only its text model, Gemma3ForCausalLM, is supported)"
              if arch == "Gemma3ForConditionalGeneration" else "")
      raise ValueError(f"config.json key 'architectures' is {archs!r}{hint}; supported: "
                       f"{sorted(_CLASSES)}")
    return _CLASSES[arch]
  model_type = hf.get("model_type")
  if model_type not in _SHORT_OF_TYPE:
    raise ValueError(
        f"config.json has no 'architectures' and its key 'model_type' is {model_type!r}; "
        f"supported: {sorted(_SHORT_OF_TYPE)}")
  return _SHORT_OF_TYPE[model_type]


def _required(hf: dict, key: str):
  if hf.get(key) is None:
    raise ValueError(f"config.json is missing the required key {key!r}")
  return hf[key]


def _rope_from_hf(hf: dict) -> tuple[float, Llama3RopeScaling | LinearRopeScaling | None]:
  """(rope_theta, scaling) from either the transformers 4.x or 5.x layout.

  4.x: top-level ``rope_theta`` and an optional ``rope_scaling`` dict.
  5.x: ``rope_parameters = {"rope_type": ..., "rope_theta": ..., <scaling keys>}``.
  """
  params = hf.get("rope_parameters")
  key = "rope_parameters"
  if params is None:
    params, key = hf.get("rope_scaling"), "rope_scaling"
  params = dict(params or {})
  if params and all(isinstance(v, dict) for v in params.values()):
    raise ValueError(f"config.json key {key!r} holds per-layer-type RoPE parameters "
                     f"({sorted(params)}); only a single RoPE is supported")
  return _rope_params(params, key, hf.get("rope_theta", 10000.0), hf)


def _rope_params(params: dict, key: str, theta, hf: dict
                 ) -> tuple[float, Llama3RopeScaling | LinearRopeScaling | None]:
  """(theta, scaling) of one RoPE parameter dict; ``theta`` when the dict has none."""
  theta = params.get("rope_theta", theta)
  if theta is None:
    theta = 10000.0
  partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
  if partial not in (None, 1, 1.0):
    raise ValueError(f"config.json key 'partial_rotary_factor' = {partial!r} is not supported "
                     "(only full rotary embeddings)")
  rope_type = params.get("rope_type", params.get("type", "default")) or "default"
  if rope_type == "default":
    return float(theta), None
  try:
    if rope_type == "linear":
      return float(theta), LinearRopeScaling(factor=float(params["factor"]))
    if rope_type == "llama3":
      return float(theta), Llama3RopeScaling(
          factor=float(params["factor"]),
          low_freq_factor=float(params["low_freq_factor"]),
          high_freq_factor=float(params["high_freq_factor"]),
          original_max_position_embeddings=int(params["original_max_position_embeddings"]))
  except KeyError as e:
    raise ValueError(f"config.json key {key!r} (rope_type {rope_type!r}) is missing {e}") from None
  raise ValueError(f"config.json key {key!r} has rope_type {rope_type!r}; supported: "
                   "'default' (or no scaling), 'linear' and 'llama3'")


def _gemma_rope(hf: dict) -> tuple[float, Llama3RopeScaling | LinearRopeScaling | None, float]:
  """(global theta, global scaling, local theta) of a Gemma 3 config.

  5.x: ``rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}``; 4.x:
  ``rope_theta`` and ``rope_scaling`` (global layers) and ``rope_local_base_freq``.
  """
  params = hf.get("rope_parameters")
  if isinstance(params, dict) and {"full_attention", "sliding_attention"} & set(params):
    full = dict(params.get("full_attention") or {})
    sliding = dict(params.get("sliding_attention") or {})
  else:
    full = dict(hf.get("rope_scaling") or {})
    sliding = {}
  theta, scaling = _rope_params(full, "rope_parameters.full_attention",
                                hf.get("rope_theta", 1_000_000.0), hf)
  local_theta, local_scaling = _rope_params(sliding, "rope_parameters.sliding_attention",
                                            hf.get("rope_local_base_freq", 10_000.0), hf)
  if local_scaling is not None:
    raise ValueError("config.json: scaled RoPE on Gemma 3 sliding layers is not supported")
  return theta, scaling, local_theta


def _sliding(hf: dict, arch: str, num_layers: int) -> tuple[int | None, tuple[str, ...] | None]:
  """(sliding_window, layer_types) as the architecture's transformers class reads them.

  Qwen2 / Qwen3: the window is ``sliding_window`` if ``use_sliding_window``; the sliding layers
  are the "sliding_attention" entries of ``layer_types`` or, without it, those with index >=
  ``max_window_layers``. Mistral: ``sliding_window`` on every layer. Gemma 3: ``layer_types``, or
  every ``sliding_window_pattern``-th layer (default 6) global and the others sliding.
  """
  layer_types = hf.get("layer_types")
  if layer_types is not None:
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
      raise ValueError(f"config.json key 'layer_types' contains unsupported {unknown}")
    if len(layer_types) != num_layers:
      raise ValueError(f"config.json key 'layer_types' has {len(layer_types)} entries for "
                       f"'num_hidden_layers' = {num_layers}")
    layer_types = ["sliding" if t == "sliding_attention" else "full" for t in layer_types]
  if arch == "llama":
    window = None
  elif arch in ("qwen2", "qwen3"):
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    if window is not None and layer_types is None:
      first = int(hf.get("max_window_layers", num_layers))
      layer_types = ["sliding" if i >= first else "full" for i in range(num_layers)]
  elif arch == "mistral":
    window = hf.get("sliding_window")
    if window is not None and layer_types is None:
      layer_types = ["sliding"] * num_layers
  else:  # gemma3
    if hf.get("use_bidirectional_attention"):
      raise ValueError("config.json key 'use_bidirectional_attention' is true; only causal "
                       "attention is supported")
    window = hf.get("sliding_window")
    if layer_types is None:
      pattern = int(hf.get("sliding_window_pattern", 6))
      layer_types = ["sliding" if (i + 1) % pattern else "full" for i in range(num_layers)]
    if window is None and "sliding" in layer_types:
      raise ValueError("config.json key 'sliding_window' is null but the Gemma 3 layers "
                       f"{[i for i, t in enumerate(layer_types) if t == 'sliding']} are sliding")
  if window is None:
    return None, None
  if not isinstance(window, int) or window < 1:
    raise ValueError(f"config.json key 'sliding_window' must be a positive integer, got "
                     f"{window!r}")
  return window, tuple(layer_types)


def config_from_hf(hf_config: dict, *, dtype: str = "float32",
                   param_dtype: str | None = None) -> TransformerConfig:
  """TransformerConfig from the config.json dict of a supported causal LM (``ARCHITECTURES``).

  Args:
    hf_config: the parsed config.json (transformers 4.x or 5.x layout).
    dtype: activation / matmul dtype name ("float32", "bfloat16", "float16").
    param_dtype: parameter dtype name; defaults to ``dtype``.

  Raises:
    ValueError naming the offending key for an unsupported architecture, activation, RoPE
    scaling type, MLP bias or attention variant.
  """
  hf = hf_config
  arch = architecture_of(hf)
  gemma = arch == "gemma3"
  act = hf.get("hidden_activation", hf.get("hidden_act")) if gemma else hf.get("hidden_act",
                                                                                "silu")
  want = "gelu_pytorch_tanh" if gemma else "silu"
  if act != want:
    key = "hidden_activation" if gemma and "hidden_activation" in hf else "hidden_act"
    raise ValueError(f"config.json key {key!r} is {act!r}; only {want!r} is supported for "
                     f"{ARCHITECTURES[arch]}")
  if hf.get("mlp_bias"):
    raise ValueError("config.json key 'mlp_bias' is true; MLP biases are not supported")
  if arch == "qwen2":
    qkv_bias, o_bias = True, False
  elif arch == "mistral":
    qkv_bias = o_bias = False
  else:  # llama, qwen3, gemma3: attention_bias puts a bias on all four projections
    qkv_bias = o_bias = bool(hf.get("attention_bias", False))
  hidden = int(_required(hf, "hidden_size"))
  heads = int(_required(hf, "num_attention_heads"))
  kv_heads = hf.get("num_key_value_heads") or heads
  head_dim = hf.get("head_dim")
  if head_dim is not None and hidden % heads == 0 and head_dim == hidden // heads:
    head_dim = None
  num_layers = int(_required(hf, "num_hidden_layers"))
  default_max = {"qwen2": 32768, "qwen3": 32768, "mistral": 32768, "gemma3": 131072}
  max_seq_len = int(hf.get("max_position_embeddings") or default_max.get(arch, 2048))
  window, layer_types = _sliding(hf, arch, num_layers)
  local_theta = None
  if gemma:
    theta, scaling, local_theta = _gemma_rope(hf)
    family = dict(_GEMMA, query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)))
    if window is None:
      local_theta = None
  else:
    theta, scaling = _rope_from_hf(hf)
    family = dict(qk_norm=arch == "qwen3")
  return TransformerConfig(
      vocab_size=int(_required(hf, "vocab_size")),
      hidden_size=hidden,
      num_layers=num_layers,
      num_heads=heads,
      num_kv_heads=int(kv_heads),
      intermediate_size=int(_required(hf, "intermediate_size")),
      head_dim=None if head_dim is None else int(head_dim),
      rope_theta=theta,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      qkv_bias=qkv_bias,
      o_bias=o_bias,
      tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
      max_seq_len=max_seq_len,
      dtype=dtype,
      param_dtype=param_dtype or dtype,
      init_std=float(hf.get("initializer_range", 0.02)),
      rope_scaling=scaling,
      # Gemma 3 has no attention-score softcapping: transformers ignores the key too.
      final_logit_softcap=hf.get("final_logit_softcapping") if gemma else None,
      sliding_window=window,
      layer_types=layer_types,
      local_rope_theta=local_theta,
      **family,
  )


def _short_arch(architecture: str) -> str:
  if architecture in ARCHITECTURES:
    return architecture
  if architecture in _CLASSES:
    return _CLASSES[architecture]
  raise ValueError(f"unsupported architecture {architecture!r}; supported: "
                   f"{sorted(ARCHITECTURES)} or {sorted(_CLASSES)}")


def architecture_for(config: TransformerConfig) -> str:
  """The short name ``config`` exports as when no architecture is given: Gemma 3 for the Gemma
  options, Qwen3 for q/k norms, Qwen2 for q/k/v-only biases, Mistral for a window on every
  layer, else Llama."""
  if config.norm_plus_one:
    return "gemma3"
  if config.qk_norm:
    return "qwen3"
  if config.qkv_bias and not config.o_bias:
    return "qwen2"
  if config.sliding_window is not None and all(config.sliding_layers):
    return "mistral"
  return "llama"


def _expressible(config: TransformerConfig, arch: str) -> None:
  """Raise ValueError naming the first option of ``config`` that ``arch`` cannot express."""
  gemma = arch == "gemma3"
  problems = []
  for name, value in _GEMMA.items():
    if name != "qk_norm" and (getattr(config, name) == value) != gemma:
      problems.append(f"{name}={getattr(config, name)!r}")
  if config.qk_norm != (arch in ("qwen3", "gemma3")):
    problems.append(f"qk_norm={config.qk_norm}")
  bias = (config.qkv_bias, config.o_bias)
  allowed = {"qwen2": [(True, False)], "mistral": [(False, False)]}.get(
      arch, [(False, False), (True, True)])
  if bias not in allowed:
    problems.append(f"qkv_bias={config.qkv_bias}, o_bias={config.o_bias}")
  if not gemma:
    for name in ("query_pre_attn_scalar", "final_logit_softcap", "local_rope_theta"):
      if getattr(config, name) is not None:
        problems.append(f"{name}={getattr(config, name)!r}")
  if gemma and config.query_pre_attn_scalar is None:
    problems.append("query_pre_attn_scalar=None")
  sliding = config.sliding_layers
  if any(sliding):
    if arch == "llama":
      problems.append(f"sliding_window={config.sliding_window}")
    if arch == "mistral" and not all(sliding):
      problems.append("layer_types with full layers (Mistral slides on every layer)")
    if arch in ("qwen2", "qwen3"):
      first = sliding.index(True)
      if not all(sliding[first:]):
        problems.append("layer_types not of the form full... then sliding...")
  if isinstance(config.rope_scaling, LinearRopeScaling) and not gemma:
    problems.append("linear RoPE scaling")
  if problems:
    raise ValueError(f"architecture {arch!r} ({ARCHITECTURES[arch]}) cannot express "
                     f"{', '.join(problems)}; use architecture={architecture_for(config)!r}")


def _int_if_whole(x: float) -> int | float:
  """transformers' Gemma 3 config declares query_pre_attn_scalar an int."""
  return int(x) if float(x).is_integer() else x


def _rope_json(scaling) -> dict | None:
  if scaling is None:
    return None
  kind = "linear" if isinstance(scaling, LinearRopeScaling) else "llama3"
  return {"rope_type": kind, **dataclasses.asdict(scaling)}


def config_to_hf(config: TransformerConfig, architecture: str | None = None) -> dict:
  """config.json contents for ``config`` as a causal LM of ``architecture``.

  Written in the transformers 4.x layout (top-level ``rope_theta``, ``rope_scaling``, and for
  Gemma 3 ``rope_local_base_freq``), which transformers 5.x also reads. ``architecture`` is a
  key of ``ARCHITECTURES`` or its class name; None: ``architecture_for(config)``. Raises
  ValueError if the config has no exact equivalent in that architecture (e.g. Qwen2 always has
  q/k/v biases; Llama cannot have them without an o_proj bias).
  """
  arch = _short_arch(architecture) if architecture is not None else architecture_for(config)
  _expressible(config, arch)
  hf: dict[str, Any] = {
      "architectures": [ARCHITECTURES[arch]],
      "model_type": MODEL_TYPES[arch],
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.resolved_head_dim,
      "max_position_embeddings": config.max_seq_len,
      "initializer_range": config.init_std,
      "rms_norm_eps": config.rms_norm_eps,
      "rope_theta": config.rope_theta,
      "rope_scaling": _rope_json(config.rope_scaling),
      "tie_word_embeddings": config.tie_embeddings,
      "attention_dropout": 0.0,
      "use_cache": True,
      "torch_dtype": config.param_dtype,
  }
  window = config.sliding_window if any(config.sliding_layers) else None
  types = [{True: "sliding_attention", False: "full_attention"}[x] for x in config.sliding_layers]
  if arch == "gemma3":
    hf.update(hidden_activation="gelu_pytorch_tanh", attention_bias=config.o_bias,
              query_pre_attn_scalar=_int_if_whole(config.query_pre_attn_scalar),
              attn_logit_softcapping=None,
              final_logit_softcapping=config.final_logit_softcap,
              sliding_window=window, layer_types=types,
              rope_local_base_freq=(config.local_rope_theta if config.local_rope_theta
                                    is not None else config.rope_theta),
              use_bidirectional_attention=False)
    return hf
  hf["hidden_act"] = "silu"
  if arch in ("qwen2", "qwen3"):
    first = config.sliding_layers.index(True) if window else config.num_layers
    hf.update(use_sliding_window=window is not None, sliding_window=window,
              max_window_layers=first, layer_types=types)
    if arch == "qwen3":
      hf["attention_bias"] = config.o_bias
  elif arch == "mistral":
    hf["sliding_window"] = window
  else:
    hf.update(attention_bias=config.o_bias, mlp_bias=False)
  return hf


# --------------------------------------------------------------------------------------------
# Parameter-name mapping
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Entry:
  hf_name: str
  path: tuple  # NNX state path
  transpose: bool  # Linear kernel: HF [out, in] <-> NNX [in, out]
  layer: int | None = None  # with layers stored stacked: the tensor is path's slice [layer]


def _param_map(cfg: TransformerConfig) -> list[_Entry]:
  """Every parameter of ``Transformer(cfg)`` with its Hugging Face tensor name."""
  entries = [_Entry("model.embed_tokens.weight", ("embed", "embedding"), False),
             _Entry("model.norm.weight", ("final_norm", "scale"), False)]
  if not cfg.tie_embeddings:
    entries.append(_Entry("lm_head.weight", ("lm_head", "kernel"), True))
  for i in range(cfg.num_layers):
    pre = f"model.layers.{i}."
    # Layers stored stacked share one path per tensor kind; the layer is an index into it.
    at, layer = (("layers",), i) if cfg.stacked_layers else (("layers", i), None)
    entry = lambda name, path, transpose: _Entry(name, at + path, transpose, layer)  # noqa: E731
    # The norm before the MLP is post_attention_layernorm in Llama's layout and
    # pre_feedforward_layernorm in Gemma's, whose post_attention_layernorm normalises the
    # attention output.
    norms = {"input_layernorm": "input_norm"}
    if cfg.sandwich_norm:
      norms.update(post_attention_layernorm="attn_out_norm",
                   pre_feedforward_layernorm="post_attn_norm",
                   post_feedforward_layernorm="mlp_out_norm")
    else:
      norms["post_attention_layernorm"] = "post_attn_norm"
    entries += [entry(f"{pre}{name}.weight", (attr, "scale"), False)
                for name, attr in norms.items()]
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
      entries.append(entry(f"{pre}self_attn.{proj}.weight", ("attn", proj, "kernel"), True))
      if cfg.o_bias if proj == "o_proj" else cfg.qkv_bias:
        entries.append(entry(f"{pre}self_attn.{proj}.bias", ("attn", proj, "bias"), False))
    if cfg.qk_norm:
      entries += [entry(f"{pre}self_attn.{n}.weight", ("attn", n, "scale"), False)
                  for n in ("q_norm", "k_norm")]
    for proj in ("gate_proj", "up_proj", "down_proj"):
      entries.append(entry(f"{pre}mlp.{proj}.weight", ("mlp", proj, "kernel"), True))
  return entries


def _hf_shape(shape: Sequence[int], transpose: bool) -> tuple[int, ...]:
  return tuple(reversed(shape)) if transpose else tuple(shape)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

def read_json(path: str | os.PathLike) -> dict:
  """The JSON object in ``path``: FileNotFoundError or ValueError (not JSON, not an object)
  naming the file."""
  try:
    with open(path) as f:
      data = json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path} not found") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(data, dict):
    raise ValueError(f"{path} is not a JSON object")
  return data


@contextlib.contextmanager
def _open_safetensors(file: Path):
  """``safe_open(file)`` for numpy; a truncated or damaged file is a ValueError naming it.

  safetensors' own ``SafetensorError`` (e.g. "incomplete metadata, file not fully covered")
  names no file; errors of the caller's own checks inside the block pass through unchanged.
  """
  from safetensors import SafetensorError, safe_open

  try:
    with safe_open(file, framework="numpy") as f:
      yield f
  except SafetensorError as e:
    raise ValueError(f"{file} is not a readable safetensors file (truncated or damaged?): "
                     f"{e}") from e


def _weight_files(path: Path) -> dict[str, Path]:
  """Tensor name -> safetensors file, from model.safetensors or the sharded index."""
  single = path / SAFE_WEIGHTS_NAME
  index = path / SAFE_WEIGHTS_INDEX_NAME
  if single.exists():
    with _open_safetensors(single) as f:
      return {name: single for name in f.keys()}
  if index.exists():
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index} has no 'weight_map' object")
    files = {}
    for name, shard in weight_map.items():
      shard_path = path / shard
      if not shard_path.exists():
        raise FileNotFoundError(f"shard {shard!r} listed in {index} for tensor {name!r} "
                                "not found")
      files[name] = shard_path
    return files
  raise FileNotFoundError(f"no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} in {path} "
                          "(only safetensors checkpoints are supported)")


def load_pretrained(path: str | os.PathLike, *, dtype: str = "float32",
                    param_dtype: str | None = None, attention: str = "xla",
                    stacked_layers: bool = False) -> Transformer:
  """Load a Hugging Face checkpoint directory of a supported architecture into a ``Transformer``.

  Args:
    path: directory with config.json and model.safetensors or model.safetensors.index.json
      (+ shards).
    dtype: activation / matmul dtype name.
    param_dtype: dtype the parameters are cast to (defaults to ``dtype``), whatever dtype the
      checkpoint stores.
    attention: ``TransformerConfig.attention`` (how uncached passes attend; not in the files).
    stacked_layers: ``TransformerConfig.stacked_layers``: the layers' tensors are stacked
      into one [num_layers, ...] parameter each (the files are the same either way).

  The module is built abstractly (``nnx.eval_shape``), so no random initialisation runs.
  Raises ValueError naming the tensor(s) for missing or unexpected tensors and for shape
  mismatches (with expected and found shapes and the file) and for truncated or damaged
  safetensors files (naming the file); FileNotFoundError for missing files.
  """
  path = Path(path)
  config = config_from_hf(read_json(path / CONFIG_NAME), dtype=dtype, param_dtype=param_dtype)
  config = config.replace(attention=attention, stacked_layers=bool(stacked_layers))
  files = _weight_files(path)
  entries = _param_map(config)
  expected = {e.hf_name for e in entries}
  missing = [e.hf_name for e in entries if e.hf_name not in files]
  if missing:
    raise ValueError(f"checkpoint {path} is missing {len(missing)} tensor(s): {missing[:20]}")
  ignored = set()
  if config.tie_embeddings:
    ignored.add("lm_head.weight")  # transformers also ignores it and re-ties to the embedding
  unexpected = sorted(n for n in files if n not in expected and n not in ignored
                      and not _HARMLESS_TENSORS.search(n))
  if unexpected:
    raise ValueError(f"checkpoint {path} has {len(unexpected)} unexpected tensor(s) for a "
                     f"{config.num_layers}-layer model with tie_embeddings="
                     f"{config.tie_embeddings}: {unexpected[:20]}")

  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  abstract_flat = dict(nnx.to_flat_state(abstract_state))
  unmapped = sorted(set(abstract_flat) - {e.path for e in entries}, key=str)
  if unmapped:
    raise AssertionError(f"parameters without a Hugging Face name: {unmapped}")
  target = _NP_DTYPES[config.param_dtype]

  by_file: dict[Path, list[_Entry]] = {}
  for e in entries:
    by_file.setdefault(files[e.hf_name], []).append(e)
  arrays: dict[tuple, jax.Array] = {}
  # Stacked paths: a host buffer [L, ...] that each layer's tensor is written into, moved to
  # the device once its last layer is in (one host copy of the tensor kind at most).
  buffers: dict[tuple, tuple[np.ndarray, set]] = {}
  for file, file_entries in by_file.items():
    with _open_safetensors(file) as f:
      for e in file_entries:
        shape = abstract_flat[e.path].shape
        want = _hf_shape(shape if e.layer is None else shape[1:], e.transpose)
        sl = f.get_slice(e.hf_name)
        found = tuple(sl.get_shape())
        if found != want:
          raise ValueError(f"tensor {e.hf_name!r} in {file} has shape {found}, expected "
                           f"{want} from config.json")
        if sl.get_dtype() not in ("F32", "F16", "BF16", "F64"):
          raise ValueError(f"tensor {e.hf_name!r} in {file} has dtype {sl.get_dtype()}, "
                           "expected a floating-point dtype")
        x = f.get_tensor(e.hf_name)
        if e.transpose:
          x = x.T
        x = np.ascontiguousarray(x.astype(target, copy=False))
        if e.layer is None:
          arrays[e.path] = jnp.asarray(x)
          continue
        if e.path not in buffers:
          buffers[e.path] = (np.empty(shape, target), set())
        buffer, done = buffers[e.path]
        buffer[e.layer] = x
        done.add(e.layer)
        if len(done) == shape[0]:
          arrays[e.path] = jnp.asarray(buffers.pop(e.path)[0])

  flat = [(p, var.replace(arrays[p])) for p, var in abstract_flat.items()]
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------

def _shards(tensors: dict[str, np.ndarray], max_shard_bytes: int | None) -> list[list[str]]:
  """Greedy, order-preserving split of tensor names into shards of <= max_shard_bytes.

  A tensor larger than the limit gets a shard of its own.
  """
  names = list(tensors)
  if max_shard_bytes is None or sum(t.nbytes for t in tensors.values()) <= max_shard_bytes:
    return [names]
  shards, current, size = [], [], 0
  for name in names:
    n = tensors[name].nbytes
    if current and size + n > max_shard_bytes:
      shards.append(current)
      current, size = [], 0
    current.append(name)
    size += n
  if current:
    shards.append(current)
  return shards


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


def _chmod_as_created(folder: Path) -> None:
  """Give ``folder`` and its files the modes a plain mkdir / open would (mkdtemp makes 0700)."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(folder, 0o777 & ~umask)
  for file in folder.iterdir():
    os.chmod(file, 0o666 & ~umask)


def save_pretrained(model: Transformer, path: str | os.PathLike, *,
                    architecture: str | None = None, max_shard_bytes: int | None = None,
                    source: str | os.PathLike | None = None,
                    bos_token_id: int | None = None,
                    eos_token_id: int | Sequence[int] | None = None,
                    pad_token_id: int | None = None,
                    extra_config: dict | None = None,
                    extra_files: Iterable[str | os.PathLike] = (),
                    overwrite: bool = False) -> Path:
  """Write ``model`` as a Hugging Face checkpoint directory loadable by transformers.

  Writes config.json and model.safetensors, or ``model-0000i-of-0000n.safetensors`` shards plus
  model.safetensors.index.json when the parameters exceed ``max_shard_bytes``. Tensors keep the
  model's parameter dtype. Tied embeddings store only ``model.embed_tokens.weight``.

  Args:
    model: the model to save.
    path: the checkpoint directory to create.
    architecture: a key of ``ARCHITECTURES`` (or the class name); None: the source's
      architecture with ``source``, else ``architecture_for(model.cfg)``. See ``config_to_hf``.
    max_shard_bytes: shard size limit in bytes; None writes a single file.
    source: the Hugging Face checkpoint directory the model came from: its special token ids
      (``special_token_ids``) go into config.json and its tokenizer files (``TOKENIZER_FILES``
      present there, generation_config.json included) are copied.
    bos_token_id, eos_token_id, pad_token_id: config.json's special ids (over ``source``'s).
    extra_config: keys merged into config.json last.
    extra_files: files copied into the checkpoint (after ``source``'s, replacing same names).
    overwrite: replace an existing ``path``; otherwise an existing path is an error.

  The checkpoint is written to a temporary sibling directory and renamed into place, so an
  interrupted save never leaves a partial checkpoint at ``path``. Returns ``path``.
  """
  from safetensors.numpy import save_file

  path = Path(path)
  if path.exists() and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
  cfg = model.cfg
  if architecture is None and source is not None:
    architecture = architecture_of(read_json(Path(source) / CONFIG_NAME))
  hf_config = config_to_hf(cfg, architecture)
  copies: list[Path] = []
  if source is not None:
    source = Path(source)
    hf_config.update(special_token_ids(source))
    copies = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
  given = dict(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
  hf_config.update({k: v for k, v in given.items() if v is not None})
  hf_config.update(extra_config or {})
  copies += [Path(f) for f in extra_files]
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  tensors: dict[str, np.ndarray] = {}
  for e in _param_map(cfg):
    x = np.asarray(jax.device_get(flat[e.path][...] if e.layer is None
                                  else flat[e.path][...][e.layer]))
    tensors[e.hf_name] = np.ascontiguousarray(x.T if e.transpose else x)

  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    with open(tmp / CONFIG_NAME, "w") as f:
      json.dump(hf_config, f, indent=2, sort_keys=True)
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
      save_file(tensors, str(tmp / SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
    else:
      weight_map = {}
      for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(tmp / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
      index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
               "weight_map": weight_map}
      with open(tmp / SAFE_WEIGHTS_INDEX_NAME, "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
    for file in copies:
      shutil.copy2(file, tmp / file.name)
    _chmod_as_created(tmp)
    if path.exists():
      old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
      os.replace(path, old / "ckpt")
      os.replace(tmp, path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

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


def _token_content(tok) -> str | None:
  if isinstance(tok, dict):
    return tok.get("content")
  return tok


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
