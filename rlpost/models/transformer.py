"""Decoder-only transformer of the Llama family, in Flax NNX, with an explicit KV cache.

Architecture: token embedding -> L x [RMSNorm -> grouped-query attention with RoPE (+residual),
RMSNorm -> gated MLP (+residual)] -> RMSNorm -> LM head (optionally tied to the embedding).
The config's options give the families ``rlpost.models.hf`` reads and writes:

  Llama    the defaults (``qkv_bias`` and ``o_bias`` for ``attention_bias=True``; Llama 3.1 RoPE)
  Qwen2    ``qkv_bias``: a bias on the q/k/v projections
  Qwen3    ``qk_norm``: per-head RMSNorm of queries and keys before RoPE; explicit ``head_dim``
  Mistral  ``sliding_window``: every layer attends to the last ``sliding_window`` positions
  Gemma 3  ``norm_plus_one`` (scale 1 + w), ``sandwich_norm`` (norms after attention and MLP
           too), ``mlp_activation="gelu_tanh"`` (GeGLU), ``embed_scale`` (sqrt(E)),
           ``qk_norm``, ``query_pre_attn_scalar``, and ``layer_types`` interleaving sliding
           ("local") layers with their own ``local_rope_theta`` and global layers

The configuration (``TransformerConfig``, re-exported here) lives in ``rlpost.models.config``,
the uncached scoring passes (``forward``, ``completion_scores``) in ``rlpost.models.scoring``,
the mask convention and the attention kernels in ``rlpost.models.attention``.

The numerics follow the Hugging Face reference implementations (RMSNorm computed in float32,
RoPE with the "rotate half" layout) so that imported checkpoints give the same logits.

Shape legend used throughout:
  B batch, T tokens in this call, S cache slots, H query heads, K key/value heads (H % K == 0),
  D head dim, E hidden size, F MLP hidden size, V vocabulary.

The model call is ``(tokens [B,T], q_tok, cache, cache_index, k_tok) -> (logits [B,T,V]
float32, cache)``. ``q_tok`` (``attention.Tokens``) gives the tokens' positions and validity,
and segment ids for packed rows; ``k_tok`` gives the cache slots' when there is a cache.
Positions are explicit so that padded prompts (left or right) see exactly the positions of
their unpadded version. Which key a query sees, the sliding window included, is decided by
``attention.visible`` from these alone, on every path (the mask convention and the padded-row
rule are in ``rlpost.models.attention``); the cache keeps every slot. The cache is a plain
pytree that travels through ``jit`` and ``lax.while_loop``; ``nnx.split`` turns the module into a
``(graphdef, params)`` pair whose params are an ordinary jit argument.

Layer storage (``stacked_layers``): ``Transformer.layers`` is a list of ``Block``s, or one
``Block`` whose parameters carry a leading [L] axis. Uncached passes over stacked layers scan
over them (the weights read in place, their gradients written stacked); cached passes run
each layer on its slice. ``with_layers_stacked`` converts a model either way (same weights),
``Transformer.layer(i)`` gives layer i as a module either way.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rlpost.models import attention as attention_lib
from rlpost.models.config import (LAYER_TYPES, MLP_ACTIVATIONS, LinearRopeScaling,  # noqa: F401
                                  Llama3RopeScaling, RopeScaling, TransformerConfig)


class LayerCache(NamedTuple):
  """Keys and values of one layer, in the cache dtype: k [B, K, D, S], v [B, K, S, D].

  Keys are stored transposed (slots minor) so the per-step score contraction q.k runs over a
  major dimension and vectorises along the slots; on CPU this layout made single-token decode
  attention ~15x faster than [B, K, S, D] at 1k slots (XLA lowers the other layout to
  batched mat-vecs that reload every key row). Values keep slots major for p.v.
  """

  k: jax.Array
  v: jax.Array


KVCache = tuple[LayerCache, ...]
# RoPE (cos, sin) tables: one pair, or (global, sliding layers') pairs
# (``Transformer.rope_tables``).
RopeTables = tuple[tuple[jax.Array, jax.Array], ...]


def init_cache(config: TransformerConfig, batch_size: int, max_len: int,
               dtype=None) -> KVCache:
  """Zero KV cache with ``max_len`` slots per layer (dtype defaults to the compute dtype)."""
  if max_len > config.max_seq_len:
    raise ValueError(
        f"cache length {max_len} exceeds the model's max_seq_len {config.max_seq_len}")
  dtype = dtype or config.compute_dtype
  b, k, d = batch_size, config.num_kv_heads, config.resolved_head_dim
  return tuple(LayerCache(jnp.zeros((b, k, d, max_len), dtype),
                          jnp.zeros((b, k, max_len, d), dtype))
               for _ in range(config.num_layers))


def extend_cache(cache: KVCache, max_len: int) -> KVCache:
  """The cache with zero slots appended up to ``max_len`` slots per layer (a copy)."""
  def grow(x, axis):
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, max_len - x.shape[axis])
    return jnp.pad(x, pad)
  return tuple(LayerCache(grow(c.k, 3), grow(c.v, 2)) for c in cache)


def rope_inv_freq(head_dim: int, theta: float,
                  scaling: RopeScaling | None = None) -> jax.Array:
  """RoPE inverse frequencies [D/2] float32, optionally with Llama 3.1 or linear scaling."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if scaling is None:
    return inv_freq
  if isinstance(scaling, LinearRopeScaling):
    return inv_freq / scaling.factor
  low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
  high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
  smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
            / (scaling.high_freq_factor - scaling.low_freq_factor))
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
  return jnp.where(is_medium, smoothed, scaled)


def rope_tables(positions: jax.Array, head_dim: int, theta: float,
                scaling: RopeScaling | None = None) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) of the RoPE angles, each [B, T, D/2] float32, for ``rope(..., tables=)``."""
  inv_freq = rope_inv_freq(head_dim, theta, scaling)  # [D/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  return jnp.cos(angles), jnp.sin(angles)


def rope(x: jax.Array, positions: jax.Array, theta: float,
         scaling: RopeScaling | None = None, *,
         tables: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
  """Rotary position embedding, "rotate half" layout (as in Hugging Face Llama / Qwen2).

  x: [B, T, N, D]; positions: [B, T] int32. Computed in float32, returned in x.dtype.
  ``tables``: the ``rope_tables(positions, D, theta, scaling)`` of these arguments, when the
  caller already has them (``Transformer.hidden`` computes them once for all layers).
  """
  d = x.shape[-1]
  cos, sin = tables if tables is not None else rope_tables(positions, d, theta, scaling)
  cos = cos[:, :, None, :]
  sin = sin[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, computed in float32.

  ``plus_one``: the Gemma form, y * (1 + scale) with ``scale`` initialised to 0.
  """

  def __init__(self, dim: int, *, eps: float, param_dtype, rngs: nnx.Rngs,
               plus_one: bool = False):
    del rngs
    self.eps = eps
    self.plus_one = plus_one
    self.scale = nnx.Param((jnp.zeros if plus_one else jnp.ones)((dim,), param_dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    scale = self.scale[...].astype(jnp.float32)
    return (y * (1.0 + scale if self.plus_one else scale)).astype(x.dtype)


def _norm(cfg: "TransformerConfig", dim: int, rngs: nnx.Rngs) -> RMSNorm:
  return RMSNorm(dim, eps=cfg.rms_norm_eps, param_dtype=cfg.params_dtype, rngs=rngs,
                 plus_one=cfg.norm_plus_one)


def _softcap(x: jax.Array, cap: float | None) -> jax.Array:
  return x if cap is None else cap * jnp.tanh(x / cap)


def _dense(cfg: TransformerConfig, din: int, dout: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(din, dout, use_bias=bias, dtype=cfg.compute_dtype,
                    param_dtype=cfg.params_dtype,
                    kernel_init=nnx.initializers.normal(cfg.init_std),
                    bias_init=nnx.initializers.zeros, rngs=rngs)


def _linear(layer: nnx.Linear, x: jax.Array) -> jax.Array:
  """``layer(x)`` with the leading dimensions flattened: [..., din] -> [..., dout].

  A rank-2 matmul differentiates into rank-2 matmuls. With [B, T, din] inputs, XLA:CPU
  computes the kernel gradient sum_{b,t} x[b,t,:]^T dy[b,t,:] by first copying dy, and
  everything fused into it (the SwiGLU gradient), into a transposed layout: a strided loop
  that cost ~3x the model's whole forward pass (BENCHMARKS.md, "Train").
  """
  x2 = x.reshape(-1, x.shape[-1])
  y = layer(x2)
  adapter = getattr(layer, "lora", None)
  if adapter is not None:  # a low-rank adapter attached by ``rlpost.models.lora.apply``
    y = y + adapter(x2).astype(y.dtype)
  return y.reshape(*x.shape[:-1], -1)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE and an explicit KV cache."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e, d = cfg.hidden_size, cfg.resolved_head_dim
    self.q_proj = _dense(cfg, e, cfg.num_heads * d, cfg.qkv_bias, rngs)
    self.k_proj = _dense(cfg, e, cfg.num_kv_heads * d, cfg.qkv_bias, rngs)
    self.v_proj = _dense(cfg, e, cfg.num_kv_heads * d, cfg.qkv_bias, rngs)
    self.o_proj = _dense(cfg, cfg.num_heads * d, e, cfg.o_bias, rngs)
    if cfg.qk_norm:
      self.q_norm = _norm(cfg, d, rngs)
      self.k_norm = _norm(cfg, d, rngs)

  def __call__(self, x, q_tok: attention_lib.Tokens, cache: LayerCache | None, cache_index,
               rope_cs: tuple[jax.Array, jax.Array] | None = None, window=None,
               k_tok: attention_lib.Tokens | None = None):
    """x [B, T, E] with its tokens' ``q_tok``. Uncached: the keys are the same tokens, through
    ``attention.attend`` by ``cfg.attention``. Cached: this call's keys and values are written
    at slot ``cache_index`` and the queries attend over every slot, whose tokens ``k_tok``
    [B, S] describes, through the shared plain kernel. ``window``: this layer's sliding
    window (None, an int or an int32 scalar)."""
    cfg = self.cfg
    b, t, _ = x.shape
    h, k_heads, d = cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    q = _linear(self.q_proj, x).reshape(b, t, h, d)
    k = _linear(self.k_proj, x).reshape(b, t, k_heads, d)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = rope(q, q_tok.pos, cfg.rope_theta, cfg.rope_scaling, tables=rope_cs)
    k = rope(k, q_tok.pos, cfg.rope_theta, cfg.rope_scaling, tables=rope_cs)
    v = _linear(self.v_proj, x).reshape(b, t, k_heads, d)
    scale = (cfg.query_pre_attn_scalar if cfg.query_pre_attn_scalar is not None else d) ** -0.5
    if cache is None:
      out = attention_lib.attend(q, k, v, q_tok, scale=scale, window=window, impl=cfg.attention)
    else:
      kt = jax.lax.dynamic_update_slice(cache.k, k.transpose(0, 2, 3, 1).astype(cache.k.dtype),
                                        (0, 0, 0, cache_index))  # [B, K, D, S]
      vt = jax.lax.dynamic_update_slice(cache.v, v.transpose(0, 2, 1, 3).astype(cache.v.dtype),
                                        (0, 0, cache_index, 0))  # [B, K, S, D]
      cache = LayerCache(kt, vt)
      out = attention_lib.grouped(q, kt, vt, attention_lib.visible(q_tok, k_tok, window), scale)
    return _linear(self.o_proj, out.reshape(b, t, h * d)), cache


class MLP(nnx.Module):
  """Gated MLP: down(act(gate(x)) * up(x)), act silu (SwiGLU) or tanh-approximate GELU (GeGLU)."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.gelu = cfg.mlp_activation == "gelu_tanh"
    self.gate_proj = _dense(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
    self.up_proj = _dense(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
    self.down_proj = _dense(cfg, cfg.intermediate_size, cfg.hidden_size, False, rngs)

  def __call__(self, x):
    gate, up = _linear(self.gate_proj, x), _linear(self.up_proj, x)
    act = jax.nn.gelu(gate, approximate=True) if self.gelu else jax.nn.silu(gate)
    return _linear(self.down_proj, act * up)


class Block(nnx.Module):
  """One decoder layer. ``post_attn_norm`` is the norm before the MLP; with ``sandwich_norm``
  ``attn_out_norm`` and ``mlp_out_norm`` normalise each branch's output before its residual."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.input_norm = _norm(cfg, cfg.hidden_size, rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = _norm(cfg, cfg.hidden_size, rngs)
    self.mlp = MLP(cfg, rngs=rngs)
    self.sandwich = cfg.sandwich_norm
    if cfg.sandwich_norm:
      self.attn_out_norm = _norm(cfg, cfg.hidden_size, rngs)
      self.mlp_out_norm = _norm(cfg, cfg.hidden_size, rngs)

  def __call__(self, x, q_tok, cache, cache_index, rope_cs=None, window=None, k_tok=None):
    a, cache = self.attn(self.input_norm(x), q_tok, cache, cache_index, rope_cs, window, k_tok)
    x = x + (self.attn_out_norm(a) if self.sandwich else a)
    m = self.mlp(self.post_attn_norm(x))
    x = x + (self.mlp_out_norm(m) if self.sandwich else m)
    return x, cache


class Transformer(nnx.Module):
  """Decoder-only LM. See the module docstring for the call convention."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype,
                           param_dtype=cfg.params_dtype,
                           embedding_init=nnx.initializers.normal(cfg.init_std), rngs=rngs)
    if cfg.stacked_layers:
      self.layers = stacked_blocks(cfg, rngs)
    else:
      self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = _norm(cfg, cfg.hidden_size, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = _dense(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs)

  def rope_tables(self, positions: jax.Array) -> RopeTables:
    """The RoPE (cos, sin) tables of ``positions`` [B, T]: one pair, or (global, local) pairs
    when sliding layers have a RoPE base of their own. Each table is [B, T, D/2] float32."""
    cfg = self.cfg
    tables = (rope_tables(positions, cfg.resolved_head_dim, cfg.rope_theta, cfg.rope_scaling),)
    if cfg.local_rope:
      tables += (rope_tables(positions, cfg.resolved_head_dim, cfg.local_rope_theta),)
    return tables

  def hidden(self, tokens, q_tok: attention_lib.Tokens, cache: KVCache | None = None,
             cache_index=0, rope_cs: RopeTables | None = None, select: jax.Array | None = None,
             remat: bool = False, k_tok: attention_lib.Tokens | None = None):
    """Final-norm hidden states [B, T, E] and the updated cache.

    ``q_tok``: the tokens' positions, validity and (packed rows) segment ids
    (``attention.padded(mask)``, ``attention.packed(positions, segments)``). Without a cache
    the keys are the same tokens; with one, ``k_tok`` [B, S] describes the cache's slots after
    this call's write at ``cache_index``.

    ``select``: optionally slots [B, N] int32; then only those positions are normed and
    returned, [B, N, E] (what a caller that scores N tokens per row needs; the final norm is
    per position, so this equals gathering the full result).
    ``remat``: recompute each layer's activations in the backward pass (``jax.checkpoint``
    per layer) instead of keeping them: activation memory of one layer instead of L, for about
    one more forward pass of compute. Only without a cache (training passes).

    ``rope_cs``: optionally ``self.rope_tables(q_tok.pos)``, e.g. gathered from a table that a
    decode loop computed once before the loop. Otherwise computed here. (XLA fuses cos/sin into
    each layer's q and k rotation and evaluates them per output element there: a few percent
    of a CPU decode step, see BENCHMARKS.md.)
    """
    chex.assert_rank([tokens, q_tok.pos, q_tok.valid], 2)
    cfg = self.cfg
    if cache is not None and (k_tok is None or q_tok.seg is not None):
      raise ValueError("Transformer.hidden: a cached pass needs k_tok (the cache slots' tokens) "
                       "and takes no segment ids")
    if cache is None and k_tok is not None:
      raise ValueError("Transformer.hidden: k_tok describes cache slots; an uncached pass's keys "
                       "are its own tokens")
    x = self.embed(tokens)
    if cfg.embed_scale:
      x = x * jnp.asarray(cfg.hidden_size ** 0.5, cfg.params_dtype).astype(x.dtype)
    if rope_cs is None:
      rope_cs = self.rope_tables(q_tok.pos)
    local = cfg.sliding_layers
    tables = (rope_cs[0], rope_cs[-1])  # (global, sliding layers')
    windows = (None, cfg.sliding_window if cfg.windowed else None)

    def inputs(is_local):
      """(rope tables, window) of a layer: by a Python bool, or a traced one inside the scan
      (where a full layer's window is the largest int32, longer than any sequence)."""
      if isinstance(is_local, bool):
        return tables[is_local], windows[is_local]
      pick = lambda g, s: jnp.where(is_local, s, g)  # noqa: E731
      window = None if windows[1] is None else pick(jnp.int32(jnp.iinfo(jnp.int32).max),
                                                     jnp.int32(windows[1]))
      return jax.tree.map(pick, *tables), window

    new_cache = []
    if cache is None and (remat or cfg.stacked_layers):
      # A scan over the layers' stacked parameters (with a checkpointed body under remat: the
      # backward scan recomputes one layer at a time, so only the L layer inputs stay live,
      # whatever the backend's scheduler; with a Python loop of checkpointed layers XLA:CPU
      # hoisted the recomputations and kept every layer's activations). Layers stored one by
      # one are stacked here, a copy of their weights (and of their gradients) per pass.
      graphdef, stacked = self.stacked_state()
      mixed = len(set(local)) > 1 and (cfg.windowed or cfg.local_rope)

      def run(x, xs):
        state, is_local = xs
        cs, window = inputs(is_local if mixed else local[0])
        return nnx.merge(graphdef, state)(x, q_tok, None, cache_index, cs, window)[0], None

      x, _ = jax.lax.scan(jax.checkpoint(run) if remat else run, x,
                          (stacked, jnp.asarray(local)))
    else:
      for i in range(cfg.num_layers):
        cs, window = inputs(local[i])
        x, c = self.layer(i)(x, q_tok, None if cache is None else cache[i], cache_index, cs,
                             window, k_tok)
        new_cache.append(c)
    if select is not None:
      x = jnp.take_along_axis(x, select[..., None], axis=1)
    return self.final_norm(x), (None if cache is None else tuple(new_cache))

  def stacked_state(self) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef of one layer, the layers' state with a leading [num_layers] axis): the
    layers' own state when stored stacked, else their states stacked (a copy)."""
    if self.cfg.stacked_layers:
      return nnx.split(self.layers)
    graphdef = nnx.split(self.layers[0])[0]
    return graphdef, jax.tree.map(lambda *xs: jnp.stack(xs),
                                  *[nnx.split(layer)[1] for layer in self.layers])

  def layer(self, i: int) -> "Block":
    """Layer ``i`` as a module of its own (a slice of the stacked layers, or the stored one)."""
    if not self.cfg.stacked_layers:
      return self.layers[i]
    graphdef, stacked = nnx.split(self.layers)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[i], stacked))

  def logits(self, h: jax.Array) -> jax.Array:
    """LM-head logits in float32: [..., E] -> [..., V]."""
    if self.cfg.tie_embeddings:
      out = self.embed.attend(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:-1], -1)
    else:
      out = _linear(self.lm_head, h)
    return _softcap(out.astype(jnp.float32), self.cfg.final_logit_softcap)

  def __call__(self, tokens, q_tok: attention_lib.Tokens, cache: KVCache | None = None,
               cache_index=0, k_tok: attention_lib.Tokens | None = None):
    h, cache = self.hidden(tokens, q_tok, cache, cache_index, k_tok=k_tok)
    return self.logits(h), cache


def stacked_blocks(cfg: TransformerConfig, rngs: nnx.Rngs) -> Block:
  """One ``Block`` whose parameters have a leading [num_layers] axis: the layers that
  ``nnx.List([Block(cfg, rngs=rngs) ...])`` draws, stacked, so a model initialises to the same
  weights whichever way it stores its layers."""
  graphdef, first = nnx.split(Block(cfg, rngs=rngs))
  rest = [nnx.split(Block(cfg, rngs=rngs))[1] for _ in range(cfg.num_layers - 1)]
  return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), first, *rest))


def with_layers_stacked(model: Transformer, stacked: bool = True) -> Transformer:
  """``model`` with its layers stored stacked (``stacked``) or one by one: the same function
  and weights (adapters included), ``cfg.stacked_layers`` set to match. Returns ``model``
  itself when it already stores them so; otherwise a new module sharing the other weights."""
  cfg = model.cfg
  if cfg.stacked_layers == stacked:
    return model
  new = nnx.merge(*nnx.split(model))
  if stacked:
    graphdef, state = model.stacked_state()
    new.layers = nnx.merge(graphdef, state)
  else:
    new.layers = nnx.List([model.layer(i) for i in range(cfg.num_layers)])
  new.cfg = cfg.replace(stacked_layers=stacked)
  return new


def apply(graphdef: nnx.GraphDef, params: nnx.State, *args, **kwargs):
  """Functional call: merge ``(graphdef, params)`` from ``nnx.split`` and run the model."""
  return nnx.merge(graphdef, params)(*args, **kwargs)


def init_model(cfg: TransformerConfig, seed: int = 0) -> Transformer:
  """A randomly initialised model (normal(init_std) weights, unit norm scales)."""
  return Transformer(cfg, rngs=nnx.Rngs(seed))
