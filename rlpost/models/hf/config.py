"""Hugging Face ``config.json``: its file name, reading it, and the mapping between it and
``TransformerConfig``.

The supported families (``ARCHITECTURES``, ``MODEL_TYPES``): ``config_from_hf`` reads a
config.json's dict into a ``TransformerConfig``, ``config_to_hf`` writes one back (raising for
options the architecture cannot express), ``architecture_of`` names a config.json's family and
``architecture_for`` the family a ``TransformerConfig`` exports as.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from rlpost.models.transformer import LinearRopeScaling, Llama3RopeScaling, TransformerConfig

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

CONFIG_NAME = "config.json"


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
