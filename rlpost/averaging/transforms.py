"""Parameter averaging as jit-safe transforms carried in the train state.

Shape legend: ``params`` is any pytree of arrays (the model's parameters, any dtype); K is the
LAWA window length. Every accumulator is float32, also for bfloat16 parameters.

Each factory takes explicit hyperparameters and returns an ``AveragingTransform`` of three pure
functions, like an ``optax.GradientTransformation`` but over parameters rather than updates
(``optax.ema`` averages updates, not parameters):

    avg = lawa(k=5, every=50)
    avg_state = avg.init(params)
    ...
    params, opt_state = train_step(params, opt_state, batch)
    avg_state = avg.update(params, avg_state)     # once per training step, after the update
    ...
    eval_params = avg.result(avg_state, params)   # averaged parameters, in params' dtypes

``update`` is called with the parameters *after* training step s = 1, 2, ...; ``state.count``
holds s. A transform with spacing ``every`` takes a snapshot when ``s % every == 0``, so in-training
averages use the same steps as checkpoints saved every ``every`` steps. Until the first snapshot,
``result`` returns ``params`` unchanged. Nothing branches in Python on a traced value: snapshots
are selected by ``lax.cond``/``jnp.where`` on the counter, so the functions run under ``jit``,
``vmap`` (over seeds or learning rates) and ``lax.scan``.

Methods:
  ``ema``        theta_ema <- d * theta_ema + (1 - d) * theta, with bias correction (zero start
                 divided by 1 - prod d) or started at the initial parameters; optional warm-up
                 d_n = min(decay, (1 + n) / (warmup + n)).
  ``swa``        uniform running mean from a start step: m <- m + (theta - m) / (n + 1)
                 (Izmailov et al. 2018).
  ``lawa``       uniform mean of the K latest snapshots taken every nu steps (Kaddour 2022;
                 Sanyal et al. 2023): a ring buffer of K snapshots and an O(1) running window sum
                 (add the newest, subtract the oldest), divided by the number actually in the
                 window and recomputed from the buffer every ``recompute_every`` snapshots to
                 bound floating-point drift.
  ``power_ema``  EDM2's power-function EMA (Karras et al. 2024, section 3):
                 beta_t = (1 - 1/t)^(gamma + 1), whose averaging profile at step t is proportional
                 to tau^gamma on [0, t]; gamma follows from the relative width sigma_rel
                 (``weights.sigma_rel_to_gamma``). Snapshots of these states let
                 ``weights.posthoc_ema_weights`` reconstruct any other width afterwards.
  ``named``      several transforms side by side; ``result`` returns a dict by name.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.averaging import weights as weights_lib

Params = Any
ACC_DTYPE = jnp.float32


class AveragingTransform(NamedTuple):
  """``init(params) -> state``, ``update(params, state) -> state``,
  ``result(state, params) -> averaged params`` (pure functions)."""

  init: Callable[[Params], Any]
  update: Callable[[Params, Any], Any]
  result: Callable[[Any, Params], Params]


def _f32(tree: Params) -> Params:
  return jax.tree.map(lambda x: jnp.asarray(x).astype(ACC_DTYPE), tree)


def _zeros(tree: Params) -> Params:
  return jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), ACC_DTYPE), tree)


def _select(pred: jax.Array, on_true: Params, on_false: Params) -> Params:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _cast_like(avg: Params, params: Params, have: jax.Array) -> Params:
  """``avg`` in the dtypes of ``params``; ``params`` itself while nothing has been averaged."""
  return jax.tree.map(lambda a, p: jnp.where(have, a.astype(jnp.result_type(p)), p), avg, params)


def _check_every(every: int, name: str = "every") -> None:
  if not isinstance(every, (int, np.integer)) or every < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {every!r}")


def _take(count: jax.Array, every: int, start: int = 0) -> jax.Array:
  """Whether step ``count`` (1-based) is a snapshot: count >= start and (count - start) % every
  == 0."""
  return (count >= max(start, 1)) & ((count - start) % every == 0)


def _second(_, second, *rest):
  """The untaken branch of a ``lax.cond``: its second operand unchanged (a stable function, so
  eager calls hit the trace cache)."""
  return second


# ------------------------------------------------------------------------------------------ EMA
class EmaState(NamedTuple):
  count: jax.Array  # int32 [], training steps seen
  num_averaged: jax.Array  # int32 [], snapshots folded in
  mass: jax.Array  # float32 [], 1 - prod(decays): the weight the average has received
  ema: Params  # float32, like params


def ema(decay: float, *, every: int = 1, debias: bool = True,
        warmup: float | None = None) -> AveragingTransform:
  """Exponential moving average of the parameters.

  decay: d in (0, 1); per snapshot (one every ``every`` steps). The mean lag of the average is
    d / (1 - d) snapshots.
  debias: start from zero and divide by the accumulated mass 1 - prod d (Adam-style bias
    correction), so early averages are not pulled towards zero; with ``debias=False`` the average
    starts at the parameters given to ``init``.
  warmup: if set, the n-th snapshot uses d_n = min(decay, (1 + n) / (warmup + n)) (the schedule of
    ``tf.train.ExponentialMovingAverage`` with ``num_updates``; ``warmup=10`` there).
  """
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"ema decay must be in [0, 1), got {decay!r}")
  _check_every(every)
  if warmup is not None and warmup <= 1:
    raise ValueError(f"ema warmup must be > 1, got {warmup!r}")

  def init(params):
    if debias:
      return EmaState(jnp.int32(0), jnp.int32(0), jnp.float32(0.0), _zeros(params))
    return EmaState(jnp.int32(0), jnp.int32(0), jnp.float32(1.0), _f32(params))

  def update(params, state):
    count = state.count + 1
    take = _take(count, every)
    n = state.num_averaged + 1
    d = jnp.float32(decay)
    if warmup is not None:
      nf = n.astype(jnp.float32)
      d = jnp.minimum(d, (1.0 + nf) / (warmup + nf))
    new = jax.tree.map(lambda m, p: d * m + (1.0 - d) * p.astype(ACC_DTYPE), state.ema, params)
    return EmaState(count=count, num_averaged=jnp.where(take, n, state.num_averaged),
                    mass=jnp.where(take, d * state.mass + (1.0 - d), state.mass),
                    ema=_select(take, new, state.ema))

  def result(state, params):
    have = state.num_averaged > 0
    if debias:
      scale = 1.0 / jnp.maximum(state.mass, jnp.finfo(jnp.float32).tiny)
      avg = jax.tree.map(lambda m: m * scale, state.ema)
    else:
      avg = state.ema
      have = jnp.bool_(True)
    return _cast_like(avg, params, have)

  return AveragingTransform(init, update, result)


def ema_lag_matched_decay(lag: float) -> float:
  """The decay whose EMA has mean lag ``lag`` snapshots: d / (1 - d) = lag."""
  if lag < 0:
    raise ValueError(f"lag must be >= 0, got {lag}")
  return float(lag / (lag + 1.0))


# ------------------------------------------------------------------------------------------ SWA
class SwaState(NamedTuple):
  count: jax.Array  # int32 []
  num_averaged: jax.Array  # int32 []
  mean: Params  # float32


def swa(*, start: int = 0, every: int = 1) -> AveragingTransform:
  """Uniform running mean of the snapshots at steps start, start + every, ... (step >= 1)."""
  _check_every(every)
  if start < 0:
    raise ValueError(f"swa start must be >= 0, got {start}")

  def init(params):
    return SwaState(jnp.int32(0), jnp.int32(0), _zeros(params))

  def update(params, state):
    count = state.count + 1
    take = _take(count, every, start)
    n = state.num_averaged.astype(jnp.float32)
    new = jax.tree.map(lambda m, p: m + (p.astype(ACC_DTYPE) - m) / (n + 1.0), state.mean, params)
    return SwaState(count, state.num_averaged + take.astype(jnp.int32),
                    _select(take, new, state.mean))

  def result(state, params):
    return _cast_like(state.mean, params, state.num_averaged > 0)

  return AveragingTransform(init, update, result)


# ----------------------------------------------------------------------------------------- LAWA
class LawaState(NamedTuple):
  count: jax.Array  # int32 []
  num_taken: jax.Array  # int32 [], snapshots taken so far (the window holds min(num_taken, K))
  buffer: Params  # like params with a leading [K] axis, in the parameters' dtypes (ring buffer)
  total: Params  # float32, sum of the snapshots in the window


def lawa(k: int, *, every: int = 1, recompute_every: int | None = None) -> AveragingTransform:
  """Latest weight averaging: the uniform mean of the ``k`` latest snapshots, one every ``every``.

  Memory: K copies of the parameters (the ring buffer) plus one float32 sum. The window sum is
  updated in O(1) per snapshot (add the newest, subtract the one it replaces) and divided by the
  number of snapshots actually in the window, so a window that is not yet full is a plain mean of
  what it holds. Every ``recompute_every`` snapshots (default ``max(k, 16)``) the sum is rebuilt
  from the buffer, which bounds the drift of repeated add/subtract in floating point.
  """
  _check_every(k, "k")
  _check_every(every)
  recompute_every = max(k, 16) if recompute_every is None else recompute_every
  _check_every(recompute_every, "recompute_every")

  def init(params):
    buf = jax.tree.map(lambda x: jnp.zeros((k,) + jnp.shape(x), jnp.result_type(x)), params)
    return LawaState(jnp.int32(0), jnp.int32(0), buf, _zeros(params))

  def snapshot(params, state):
    slot = state.num_taken % k
    full = state.num_taken >= k
    taken = state.num_taken + 1

    def put(b, p):
      return b.at[slot].set(p.astype(b.dtype))

    def add(b, t, p):
      # The stored (parameter-dtype) value is what is added now and subtracted later.
      new = p.astype(b.dtype).astype(ACC_DTYPE)
      return t + new - jnp.where(full, b[slot].astype(ACC_DTYPE), 0.0)

    tot = jax.tree.map(add, state.buffer, state.total, params)
    buf = jax.tree.map(put, state.buffer, params)
    valid = jnp.arange(k) < jnp.minimum(taken, k)

    tot = jax.lax.cond(taken % recompute_every == 0, recompute, _second, buf, tot, valid)
    return LawaState(state.count, taken, buf, tot)

  def recompute(buf, tot, valid):
    def one(b):
      w = valid.reshape((k,) + (1,) * (b.ndim - 1)).astype(ACC_DTYPE)
      return jnp.sum(b.astype(ACC_DTYPE) * w, axis=0)
    return jax.tree.map(one, buf)

  def update(params, state):
    state = state._replace(count=state.count + 1)
    return jax.lax.cond(_take(state.count, every), snapshot, _second, params, state)

  def result(state, params):
    n = jnp.minimum(state.num_taken, k).astype(ACC_DTYPE)
    avg = jax.tree.map(lambda t: t / jnp.maximum(n, 1.0), state.total)
    return _cast_like(avg, params, state.num_taken > 0)

  return AveragingTransform(init, update, result)


# ------------------------------------------------------------------------------ power-function EMA
class PowerEmaState(NamedTuple):
  count: jax.Array  # int32 [], t
  ema: Params  # float32


def power_ema(sigma_rel: float | None = None, *, gamma: float | None = None) -> AveragingTransform:
  """EDM2 power-function EMA with relative width ``sigma_rel`` (or exponent ``gamma``).

  theta_hat_t = beta_t * theta_hat_{t-1} + (1 - beta_t) * theta_t with
  beta_t = (1 - 1/t)^(gamma + 1) for t = 1, 2, ... (so theta_hat_1 = theta_1). The weight of
  theta_tau in theta_hat_t is (1 - (1 - 1/tau)^(gamma+1)) * (tau / t)^(gamma+1), a discrete
  version of the profile (gamma + 1) tau^gamma / t^(gamma + 1) on [0, t]; sigma_rel is that
  profile's standard deviation divided by t. Karras et al. 2024 track sigma_rel = 0.05 and 0.10.
  """
  if (sigma_rel is None) == (gamma is None):
    raise ValueError("power_ema needs exactly one of sigma_rel and gamma")
  g = weights_lib.sigma_rel_to_gamma(sigma_rel) if gamma is None else float(gamma)
  if g <= -1:
    raise ValueError(f"power_ema gamma must be > -1, got {g}")

  def init(params):
    return PowerEmaState(jnp.int32(0), _zeros(params))

  def update(params, state):
    count = state.count + 1
    t = count.astype(jnp.float32)
    beta = (1.0 - 1.0 / t) ** (g + 1.0)
    ema = jax.tree.map(lambda m, p: beta * m + (1.0 - beta) * p.astype(ACC_DTYPE),
                       state.ema, params)
    return PowerEmaState(count, ema)

  def result(state, params):
    return _cast_like(state.ema, params, state.count > 0)

  return AveragingTransform(init, update, result)


# ---------------------------------------------------------------------------------- composition
def named(**transforms: AveragingTransform) -> AveragingTransform:
  """Several averages of the same parameters side by side; state and result are dicts by name."""
  if not transforms:
    raise ValueError("named() needs at least one transform")

  def init(params):
    return {k: t.init(params) for k, t in transforms.items()}

  def update(params, state):
    return {k: t.update(params, state[k]) for k, t in transforms.items()}

  def result(state, params):
    return {k: t.result(state[k], params) for k, t in transforms.items()}

  return AveragingTransform(init, update, result)
