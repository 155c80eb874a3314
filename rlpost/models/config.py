"""The decoder's configuration: ``TransformerConfig`` and its RoPE scalings.

Plain frozen dataclasses with validation in ``__post_init__``; no arrays are made here. The
options and the families they give are described in ``rlpost.models.transformer``;
``rlpost.models.hf`` maps a checkpoint's ``config.json`` onto them.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from rlpost.models import attention as attention_lib

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama 3.1 frequency-dependent RoPE scaling (Hugging Face ``"rope_type": "llama3"``).

  Wavelengths shorter than ``original_max_position_embeddings / high_freq_factor`` keep their
  frequency, those longer than ``original_max_position_embeddings / low_freq_factor`` are
  divided by ``factor``, and the band in between is interpolated smoothly.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class LinearRopeScaling:
  """Position interpolation (Hugging Face ``"rope_type": "linear"``): frequencies / factor."""

  factor: float


RopeScaling = Llama3RopeScaling | LinearRopeScaling
LAYER_TYPES = ("full", "sliding")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyperparameters of the decoder. All fields are plain Python values (hashable, static)."""

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  intermediate_size: int
  head_dim: int | None = None  # defaults to hidden_size // num_heads
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False  # True for Qwen2
  tie_embeddings: bool = False
  max_seq_len: int = 4096  # longest position the model accepts (cache length limit)
  dtype: str = "float32"  # activation / matmul dtype
  param_dtype: str = "float32"
  init_std: float = 0.02
  rope_scaling: RopeScaling | None = None  # None: plain RoPE
  # Family options (see the module docstring); the defaults give Llama / Qwen2.
  o_bias: bool = False  # a bias on the output projection too (attention_bias=True)
  qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE
  norm_plus_one: bool = False  # RMSNorm scales by (1 + w), w initialised to 0
  sandwich_norm: bool = False  # RMSNorm of the attention and the MLP outputs too
  mlp_activation: str = "silu"  # gate activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
  embed_scale: bool = False  # embeddings times sqrt(hidden_size)
  query_pre_attn_scalar: float | None = None  # attention scale s**-0.5 (None: head_dim**-0.5)
  final_logit_softcap: float | None = None  # logits -> c * tanh(logits / c)
  sliding_window: int | None = None  # a query sees keys less than this many positions back
  # Per layer "full" or "sliding"; None: every layer "sliding" with a window, else "full".
  layer_types: tuple[str, ...] | None = None
  local_rope_theta: float | None = None  # RoPE base of sliding layers, unscaled (None: shared)
  # Attention of passes without a KV cache (training, scoring): "xla" (materialised scores),
  # "blockwise" (flash attention, memory O(T)) or "cudnn" (GPUs); see rlpost.models.attention.
  attention: str = "xla"
  # Layers stored stacked: ``Transformer.layers`` is one ``Block`` whose parameters have a
  # leading [num_layers] axis, and uncached passes scan over it (``Transformer.hidden``). The
  # same function as layers stored one by one; with remat the gradient pass reads the weights
  # in place and writes their gradients stacked, with no copy of them (what full-size runs
  # need). The sampler slices them into layers once per call (``rlpost.sampling.sample``).
  stacked_layers: bool = False

  def __post_init__(self):
    if isinstance(self.rope_scaling, dict):
      kind = LinearRopeScaling if set(self.rope_scaling) == {"factor"} else Llama3RopeScaling
      object.__setattr__(self, "rope_scaling", kind(**self.rope_scaling))
    if self.rope_scaling is not None and not isinstance(self.rope_scaling,
                                                        (Llama3RopeScaling, LinearRopeScaling)):
      raise ValueError("TransformerConfig.rope_scaling must be None, a Llama3RopeScaling or a "
                       f"LinearRopeScaling, got {self.rope_scaling!r}")
    if self.layer_types is not None:
      object.__setattr__(self, "layer_types", tuple(self.layer_types))
      if len(self.layer_types) != self.num_layers:
        raise ValueError(f"TransformerConfig.layer_types has {len(self.layer_types)} entries "
                         f"for {self.num_layers} layers")
      unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
      if unknown:
        raise ValueError(f"TransformerConfig.layer_types has {unknown}; each entry is one of "
                         f"{LAYER_TYPES}")
      if "sliding" in self.layer_types and self.sliding_window is None:
        raise ValueError("TransformerConfig.layer_types has 'sliding' layers but "
                         "sliding_window is None")
    if self.sliding_window is not None and (not isinstance(self.sliding_window, int)
                                            or self.sliding_window < 1):
      raise ValueError("TransformerConfig.sliding_window must be None or a positive int, got "
                       f"{self.sliding_window!r}")
    # One spelling per model: every layer sliding is layer_types=None; none sliding, no window.
    if self.layer_types is not None and len(set(self.layer_types)) == 1:
      if self.layer_types[0] == "full":
        object.__setattr__(self, "sliding_window", None)
      object.__setattr__(self, "layer_types", None)
    if self.attention not in attention_lib.IMPLS:
      raise ValueError(f"TransformerConfig.attention must be one of {attention_lib.IMPLS}, "
                       f"got {self.attention!r}")
    if self.mlp_activation not in MLP_ACTIVATIONS:
      raise ValueError(f"TransformerConfig.mlp_activation must be one of {MLP_ACTIVATIONS}, "
                       f"got {self.mlp_activation!r}")
    for name in ("query_pre_attn_scalar", "final_logit_softcap",
                 "local_rope_theta"):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f"TransformerConfig.{name} must be None or positive, got {value!r}")
    positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                "intermediate_size", "max_seq_len")
    for name in positive:
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"TransformerConfig.num_heads ({self.num_heads}) must be a multiple of "
          f"num_kv_heads ({self.num_kv_heads})")
    if self.head_dim is None and self.hidden_size % self.num_heads:
      raise ValueError(
          f"TransformerConfig.hidden_size ({self.hidden_size}) is not divisible by num_heads "
          f"({self.num_heads}); set head_dim explicitly")
    if self.resolved_head_dim % 2:
      raise ValueError(f"TransformerConfig.head_dim must be even for RoPE, got "
                       f"{self.resolved_head_dim}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"TransformerConfig.{name} must be one of {sorted(_DTYPES)}, "
                         f"got {getattr(self, name)!r}")

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

  @property
  def sliding_layers(self) -> tuple[bool, ...]:
    """Per layer, whether it attends through the sliding window."""
    if self.sliding_window is None:
      return (False,) * self.num_layers
    if self.layer_types is None:
      return (True,) * self.num_layers
    return tuple(t == "sliding" for t in self.layer_types)

  @property
  def windowed(self) -> bool:
    """Whether some layer's window can cut a sequence of ``max_seq_len`` positions."""
    return any(self.sliding_layers) and self.sliding_window < self.max_seq_len

  @property
  def local_rope(self) -> bool:
    """Whether sliding layers use RoPE tables of their own (``local_rope_theta``)."""
    return self.local_rope_theta is not None and any(self.sliding_layers)

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **kwargs) -> "TransformerConfig":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    """Number of parameters, computed from the config alone."""
    e, d, f, v = self.hidden_size, self.resolved_head_dim, self.intermediate_size, self.vocab_size
    attn = e * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * e
    if self.qkv_bias:
      attn += d * (self.num_heads + 2 * self.num_kv_heads)
    attn += e * self.o_bias + 2 * d * self.qk_norm
    layer = attn + 3 * e * f + (4 if self.sandwich_norm else 2) * e
    head = 0 if self.tie_embeddings else e * v
    return v * e + self.num_layers * layer + e + head
