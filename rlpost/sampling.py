"""Pure, jitted KV-cache sampler: prefill, then a ``lax.while_loop`` decode.

Shape legend: B batch (rollouts), Tp prompt buffer length, N max new tokens, S = Tp + N cache
slots, V vocabulary.

Layout. The prompt buffer occupies cache slots [0, Tp); token i of the completion is written to
slot Tp + i when it is fed back (decode step i + 1). Padding
slots of the prompt (left, right or anywhere) are masked out of attention, and positions are
counted over valid tokens only, so a padded prompt produces exactly the completion of its
unpadded version. All shapes are static: one compilation per (B, Tp, N, config).

Randomness. The key of decode step i is ``fold_in(key, i)``; the same key gives the same
output, and because JAX's threefry is partitionable, the same output on any device mesh. With
one key per row (``key`` of shape [B]) row b draws its noise from ``fold_in(key[b], i)`` alone,
so a row's completion does not depend on which other rows share the call: sampling the rows
in chunks, or in another order, draws the same tokens (up to float rounding of the batched
forward pass, which can only matter at an exact near-tie of two tokens).

Log-probs. For every sampled token the sampler returns its log-probability under the sampling
distribution (temperature, top-k and top-p applied; 0 for greedy decoding, which is a point mass)
and under the unmodified policy (temperature 1, no filtering), the latter being what an
importance-sampling correction compares the trainer's log-probs against.

Decode loop. The decode steps run as a few consecutive ``lax.while_loop`` segments
(``SamplingConfig.decode_segments``), each over a KV cache just long enough for its last step,
so attention reads and masks only slots that can be valid. The per-step work is kept lean for
small-batch CPU decoding: RoPE cos/sin come from a table computed once, argmax and
log-softmax are plain reductions, and top-p uses a sort-free bisection (see BENCHMARKS.md for
what each measurably gives).

Buffers. The KV cache is allocated inside the jitted program and carried by the while loops, so
XLA updates it in place and no host buffer exists to donate; the prompt buffers passed in are
donated when ``donate_prompts=True``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from rlpost.models import attention
from rlpost.models import transformer as tfm
from rlpost import tokenizer

FINISH_STOP = 0  # the sequence emitted a stop token
FINISH_LENGTH = 1  # the sequence hit max_new_tokens


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Static decoding settings.

  max_new_tokens: N, the completion buffer length.
  temperature: 0 means greedy (argmax); otherwise logits are divided by it.
  top_k: keep the k largest logits (0 disables). Ties with the k-th value are kept.
  top_p: nucleus sampling, keep the smallest set of tokens whose probability reaches top_p
    (1.0 disables); the most likely token is always kept.
  stop_tokens: token ids that end a sequence; the stop token is part of the completion.
  pad_id: written after a sequence has finished.
  decode_segments: the decode loop runs as this many consecutive ``while_loop``s, each over a
    KV cache only as long as its last step needs (attention cost then grows with the
    sequence instead of always covering Tp + N slots); every segment compiles its own copy of
    the decode step. 0 picks ``min(4, ceil((N - 1) / 32))``. Results do not depend on it
    beyond float rounding.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  stop_tokens: tuple[int, ...] = ()
  pad_id: int = 0
  decode_segments: int = 0

  def __post_init__(self):
    if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
      raise ValueError(f"SamplingConfig.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
    if self.temperature < 0:
      raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
    if not isinstance(self.decode_segments, int) or self.decode_segments < 0:
      raise ValueError("SamplingConfig.decode_segments must be an int >= 0, got "
                       f"{self.decode_segments!r}")
    object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  @property
  def num_segments(self) -> int:
    if self.decode_segments:
      return self.decode_segments
    return max(1, min(4, -(-(self.max_new_tokens - 1) // 32)))


@struct.dataclass
class SampleOutput:
  """Result of one sampler call (all arrays have leading dimension B).

  tokens: [B, N] int32 completion tokens (pad_id after the end).
  mask: [B, N] bool, True for generated tokens (the stop token included).
  lengths: [B] int32, number of generated tokens.
  finish_reason: [B] int32, FINISH_STOP or FINISH_LENGTH.
  logprobs: [B, N] float32, log-prob of each token under the sampling distribution (0 where
    masked, and 0 everywhere for greedy decoding).
  policy_logprobs: [B, N] float32, log-prob under the unmodified policy (0 where masked).
  num_steps: [] int32, decode steps actually run (early exit when all sequences stopped).
  """

  tokens: jax.Array
  mask: jax.Array
  lengths: jax.Array
  finish_reason: jax.Array
  logprobs: jax.Array
  policy_logprobs: jax.Array
  num_steps: jax.Array


def filter_logits(logits: jax.Array, *, temperature: float, top_k: int, top_p: float) -> jax.Array:
  """Temperature, top-k and top-p applied to logits [..., V] float32; removed entries are -inf.

  top-p keeps the tokens, in order of decreasing logit, while the probability mass before them
  is below ``top_p``, and every token tied with the last one kept. The cut-off is found
  without sorting, by a search over the float bit patterns (``_nucleus_threshold``).
  """
  if temperature > 0:
    logits = logits / temperature
  neg_inf = jnp.array(-jnp.inf, logits.dtype)
  if top_k > 0 and top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, neg_inf, logits)
  if top_p < 1.0:
    keys = _ordered_keys(logits)
    threshold = _nucleus_threshold(keys, jax.nn.softmax(logits, axis=-1), top_p)
    logits = jnp.where(keys < threshold, neg_inf, logits)
  return logits


def _ordered_keys(x: jax.Array) -> jax.Array:
  """uint32 keys whose unsigned order is the order of the float32 values x (-0.0 == +0.0)."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.uint32)  # -0.0 -> +0.0
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _nucleus_threshold(keys: jax.Array, probs: jax.Array, top_p: float) -> jax.Array:
  """Key [..., 1] of the smallest logit that top-p keeps: a bisection instead of a sort.

  With f(c) = the probability mass of the tokens whose key is > c (non-increasing in c), the
  smallest kept logit is the smallest key c with f(c) < top_p: in sorted order, the first
  token of c's tie group has exactly f(c) before it, and the first token of the next lower
  value has f >= top_p before it. Bisection keeps a bracket f(lo) >= top_p > f(hi) and halves
  it 32 times, resolving every bit of the key: the result is exact. Each step is one fused
  masked sum over [..., V] (cheaper on CPU than a sort of [..., V]; see BENCHMARKS.md).
  """
  hi = jnp.max(keys, axis=-1, keepdims=True)  # f(hi) = 0 < top_p
  lo = jnp.min(keys, axis=-1, keepdims=True) - 1  # below every key (keys are >= 2**23 - 1)

  def step(_, bracket):
    lo, hi = bracket
    mid = lo + (hi - lo) // 2
    mass = jnp.sum(jnp.where(keys > mid, probs, 0.0), axis=-1, keepdims=True)
    below = mass < top_p
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  _, hi = jax.lax.fori_loop(0, 32, step, (lo, hi))
  return hi


def _argmax(x: jax.Array) -> jax.Array:
  """``jnp.argmax(x, axis=-1)`` as int32 (first maximal index; a NaN counts as the maximum).

  Written as a max, then a min over the indices attaining it: two plain reductions that XLA
  vectorises, where ``jnp.argmax`` lowers to a variadic (value, index) reduction that XLA:CPU
  runs element by element (measured 2.5-8x slower over [B, V] logits for B >= 16).
  """
  v = x.shape[-1]
  m = jnp.max(x, axis=-1, keepdims=True)
  hit = (x == m) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1)


def _log_normaliser(logits: jax.Array):
  """(row max [B, 1], log sum exp(logits - max) [B, 1]), as in ``jax.nn.log_softmax``."""
  m = jnp.max(logits, axis=-1, keepdims=True)
  return m, jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True))


def _logp_of(logits: jax.Array, token: jax.Array) -> jax.Array:
  """``jax.nn.log_softmax(logits)[token]`` per row without materialising the [B, V] result."""
  m, lse = _log_normaliser(logits)
  picked = jnp.take_along_axis(logits, token[:, None], axis=-1)
  return ((picked - m) - lse)[:, 0]


def _gumbel(key: jax.Array, shape: tuple[int, int], dtype) -> jax.Array:
  """Gumbel noise [B, V]: from one key (shape []) or one key per row (shape [B])."""
  if key.ndim == 0:
    return jax.random.gumbel(key, shape, dtype)
  return jax.vmap(lambda k: jax.random.gumbel(k, shape[1:], dtype))(key)


def _step_key(key: jax.Array, i) -> jax.Array:
  """The key of decode step i: ``fold_in`` of the call's key, or of each row's key."""
  if key.ndim == 0:
    return jax.random.fold_in(key, i)
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, i)


def _typed_key(key: jax.Array, batch: int) -> jax.Array:
  """``key`` as a typed PRNG key of shape [] or [batch] (raw uint32 key data is wrapped)."""
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  if key.shape not in ((), (batch,)):
    raise ValueError(f"key must be one PRNG key or one per row ([{batch}]), got shape {key.shape}")
  return key


def _pick(logits: jax.Array, key: jax.Array, cfg: SamplingConfig):
  """Choose one token per row. logits: [B, V] float32 -> (tokens, sampling logp, policy logp).

  key: one PRNG key (shape []) or one per row (shape [B]). The policy log-prob is that of the
  unmodified logits (temperature 1, no filtering).
  """
  if cfg.greedy:
    token = _argmax(logits)
    # The argmax attains the row max, so log_softmax(logits)[token] = 0 - lse exactly.
    _, lse = _log_normaliser(logits)
    return token, jnp.zeros(token.shape, jnp.float32), -lse[:, 0]
  filtered = filter_logits(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
  # Gumbel-max with the same noise as jax.random.categorical(key, filtered): same tokens.
  token = _argmax(_gumbel(key, filtered.shape, filtered.dtype) + filtered)
  return token, _logp_of(filtered, token), _logp_of(logits, token)


def decode_segments(prompt_len: int, max_new_tokens: int, num_segments: int):
  """Split decode steps 1..N-1 into ``num_segments`` runs [(first, stop, cache_slots)].

  Step i feeds token i-1 into cache slot Tp + i - 1, so a run of steps [first, stop) needs
  Tp + stop - 1 slots. Each run is its own ``while_loop`` over a cache of exactly that many
  slots, so early steps do not read (and mask) the not-yet-written tail of the cache.
  """
  steps = max_new_tokens - 1
  k = max(1, min(num_segments, steps))
  bounds = [1 + (steps * j) // k for j in range(k + 1)]
  return [(a, b, prompt_len + b - 1) for a, b in itertools.pairwise(bounds) if b > a]


def sample(graphdef: nnx.GraphDef, params: nnx.State, prompt_tokens: jax.Array,
           prompt_mask: jax.Array, key: jax.Array, *, cfg: SamplingConfig) -> SampleOutput:
  """Sample completions. Pure and traceable; ``Sampler`` wraps it in ``jax.jit``.

  prompt_tokens: [B, Tp] int32; prompt_mask: [B, Tp] bool (each row needs >= 1 valid token);
  key: a PRNG key (shape []), or one per row (shape [B]: each row's tokens then depend only on
  its own key, not on the other rows of the call). Returns a SampleOutput with
  N = cfg.max_new_tokens.
  """
  chex.assert_rank([prompt_tokens, prompt_mask], 2)
  chex.assert_equal_shape([prompt_tokens, prompt_mask])
  # Layers stored stacked are sliced into layers once, here, before the decode loop: one copy
  # of the layer weights for the call, instead of slices inside the loop, which copy every
  # layer's weights at every step.
  model = tfm.with_layers_stacked(nnx.merge(graphdef, params), False)
  b, tp = prompt_tokens.shape
  n = cfg.max_new_tokens
  key = _typed_key(key, b)
  if tp + n > model.cfg.max_seq_len:
    raise ValueError(f"prompt length {tp} + max_new_tokens {n} exceeds the model's max_seq_len "
                     f"{model.cfg.max_seq_len}")
  segments = decode_segments(tp, n, cfg.num_segments)
  prompt_mask = prompt_mask.astype(bool)

  # Prefill: attend causally over the valid prompt slots (a cache of exactly Tp slots).
  cache = tfm.init_cache(model.cfg, b, tp)
  prompt = attention.padded(prompt_mask)  # the prompt slots' tokens
  # Logits of the last valid prompt token of each row (any padding layout).
  last = tp - 1 - jnp.argmax(prompt_mask[:, ::-1], axis=-1)
  h, cache = model.hidden(prompt_tokens, prompt, cache, 0, select=last[:, None],
                          k_tok=prompt)
  logits = model.logits(h[:, 0])  # [B, V]
  next_pos = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)  # position of token 0

  stop = jnp.asarray(cfg.stop_tokens if cfg.stop_tokens else (-1,), jnp.int32)
  pad = jnp.int32(cfg.pad_id)

  def emit(i, logits, done, tokens, logps, plogps, stopped):
    """Sample token i from logits [B, V] and record it for rows not yet done."""
    token, logp, plogp = _pick(logits, _step_key(key, i), cfg)
    live = ~done
    token = jnp.where(live, token, pad)
    tokens = tokens.at[:, i].set(token)
    logps = logps.at[:, i].set(jnp.where(live, logp, 0.0))
    plogps = plogps.at[:, i].set(jnp.where(live, plogp, 0.0))
    hit = live & jnp.any(token[:, None] == stop[None, :], axis=-1) & bool(cfg.stop_tokens)
    return token, done | hit, tokens, logps, plogps, stopped | hit

  zeros_f = jnp.zeros((b, n), jnp.float32)
  done0 = jnp.zeros((b,), bool)
  token, done, tokens, logps, plogps, stopped = emit(
      0, logits, done0, jnp.full((b, n), pad, jnp.int32), zeros_f, zeros_f, done0)

  # RoPE cos/sin of every position a decode step can feed, computed once; a step gathers its row.
  rope_all = model.rope_tables(jnp.arange(tp + n)[None])  # pairs of [1, Tp + N, D/2]

  def run_segment(carry, stop_step: int, slots: int):
    """Decode steps [carry's i, stop_step) over a cache of ``slots`` slots."""
    # The slots' tokens: the prompt's, then token j - 1 of the completion at slot Tp + j - 1,
    # at position next_pos + j - 1; a slot is valid once written.
    slot = jnp.arange(slots)
    k_pos = jnp.where(slot < tp, jnp.pad(prompt.pos, ((0, 0), (0, slots - tp))),
                      next_pos[:, None] + slot - tp)  # [B, slots]
    prompt_slots = jnp.pad(prompt_mask, ((0, 0), (0, slots - tp)))

    def cond(carry):
      i, _, done, *_ = carry
      return (i < stop_step) & ~jnp.all(done)

    def body(carry):
      i, token, done, tokens, logps, plogps, stopped, cache = carry
      # Feed token i-1 (written at slot Tp + i - 1), then sample token i.
      write = tp + i - 1
      keys = attention.Tokens(k_pos, prompt_slots | ((slot >= tp) & (slot <= write))[None, :])
      pos = (next_pos + i - 1)[:, None]
      rope_cs = jax.tree.map(lambda table: jnp.take(table[0], pos, axis=0), rope_all)
      h, cache = model.hidden(token[:, None], attention.Tokens(pos, jnp.ones_like(pos, bool)),
                              cache, write, rope_cs, k_tok=keys)
      logits = model.logits(h[:, 0])
      token, done, tokens, logps, plogps, stopped = emit(
          i, logits, done, tokens, logps, plogps, stopped)
      return i + 1, token, done, tokens, logps, plogps, stopped, cache

    return jax.lax.while_loop(cond, body, carry)

  carry = (jnp.int32(1), token, done, tokens, logps, plogps, stopped, cache)
  for _, stop_step, slots in segments:
    carry = carry[:7] + (tfm.extend_cache(carry[7], slots),)
    carry = run_segment(carry, stop_step, slots)
  steps, _, _, tokens, logps, plogps, stopped, _ = carry

  mask = jnp.arange(n)[None, :] < _lengths(tokens, stopped, stop, steps, cfg)[:, None]
  lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
  finish = jnp.where(stopped, FINISH_STOP, FINISH_LENGTH).astype(jnp.int32)
  return SampleOutput(tokens=tokens, mask=mask, lengths=lengths, finish_reason=finish,
                      logprobs=logps, policy_logprobs=plogps, num_steps=steps)


def _lengths(tokens, stopped, stop, steps, cfg: SamplingConfig):
  """[B] int32 completion lengths: up to and including the first stop token, else all steps."""
  n = tokens.shape[1]
  is_stop = jnp.any(tokens[:, :, None] == stop[None, None, :], axis=-1) & bool(cfg.stop_tokens)
  first_stop = jnp.argmax(is_stop, axis=-1)
  return jnp.where(stopped, first_stop + 1, jnp.minimum(steps, n)).astype(jnp.int32)


class Sampler:
  """Host-side front end: validates inputs with clear errors and calls the jitted sampler.

  >>> sampler = Sampler(model, SamplingConfig(max_new_tokens=32, temperature=1.0))
  >>> graphdef, params = nnx.split(model)
  >>> out = sampler(params, prompt_tokens, prompt_mask, jax.random.key(0))

  Only the model's structure (its graphdef and config) is kept; parameters are passed per call.

  ``sampler.fn`` is the jitted pure function ``(params, prompt_tokens, prompt_mask, key)``, for
  use inside larger jitted programs (call ``sample`` directly there).
  """

  def __init__(self, model: tfm.Transformer, cfg: SamplingConfig, *, donate_prompts: bool = False):
    graphdef = nnx.graphdef(model)
    model_cfg = model.cfg
    for t in cfg.stop_tokens:
      if not 0 <= t < model_cfg.vocab_size:
        raise ValueError(f"stop token {t} is not in the vocabulary [0, {model_cfg.vocab_size})")
    if not 0 <= cfg.pad_id < model_cfg.vocab_size:
      raise ValueError(f"pad_id {cfg.pad_id} is not in the vocabulary [0, {model_cfg.vocab_size})")
    self.graphdef = graphdef
    self.cfg = cfg
    self.model_cfg = model_cfg
    self.num_traces = 0  # how many times the sampler was traced (= compiled) so far

    def traced(params, prompt_tokens, prompt_mask, key):
      self.num_traces += 1  # a Python side effect: runs at trace time only
      return sample(graphdef, params, prompt_tokens, prompt_mask, key, cfg=cfg)

    self.fn = jax.jit(traced, donate_argnums=(1, 2) if donate_prompts else ())

  def validate(self, prompt_tokens, prompt_mask) -> None:
    """Raise ValueError naming the problem for malformed prompt batches."""
    shape = np.shape(prompt_tokens)
    if len(shape) != 2:
      raise ValueError(f"prompt_tokens must be [batch, length], got shape {shape}")
    if np.shape(prompt_mask) != shape:
      raise ValueError(f"prompt_mask shape {np.shape(prompt_mask)} != prompt_tokens shape {shape}")
    if shape[0] == 0:
      raise ValueError("empty batch: prompt_tokens has 0 rows")
    if shape[1] == 0:
      raise ValueError("empty prompts: prompt_tokens has length 0")
    total = shape[1] + self.cfg.max_new_tokens
    if total > self.model_cfg.max_seq_len:
      raise ValueError(
          f"prompt length {shape[1]} + max_new_tokens {self.cfg.max_new_tokens} = {total} exceeds "
          f"the cache limit max_seq_len={self.model_cfg.max_seq_len}")
    mask = np.asarray(prompt_mask).astype(bool)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
      raise ValueError(f"prompt {int(empty[0])} has no valid token (all padding)")
    toks = np.asarray(prompt_tokens)
    bad = np.argwhere(mask & ((toks < 0) | (toks >= self.model_cfg.vocab_size)))
    if bad.size:
      i, j = bad[0]
      raise ValueError(f"prompt {int(i)} has token {int(toks[i, j])} at position {int(j)} outside "
                       f"the vocabulary [0, {self.model_cfg.vocab_size})")

  def __call__(self, params, prompt_tokens, prompt_mask, key, *, validate: bool = True) -> SampleOutput:
    if validate:
      self.validate(prompt_tokens, prompt_mask)
    return self.fn(params, prompt_tokens, prompt_mask, key)


def pad_prompts(prompts: Sequence[Sequence[int]], *, pad_id: int = 0, side: str = "left",
                length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Pack token lists into a padded [B, Tp] int32 buffer and a [B, Tp] bool mask (host side)."""
  return tokenizer.pad(prompts, pad_id=pad_id, length=length, side=side, what="prompt",
                       allow_empty=False)
