"""The optimizer part of an RL step, as a pure function of its inputs.

``make_update(...)`` returns ``update(params, opt_state, batch, prompts, pmask, adv, key)
-> (params, opt_state, stats)``: ``num_iterations`` epochs over ``num_minibatches`` shuffled
mini-batches of the rollout rows, each mini-batch's gradient accumulated over ``grad_accum``
micro-batches. Losses are (sum, denominator) pairs (``rlpost.objectives.LossParts``) whose
denominators do not depend on the parameters, so a mini-batch's loss and gradient are the same
whatever ``grad_accum`` is.

Frozen parameters (LoRA): with ``trainable`` (a function of the parameters giving a mask, e.g.
``rlpost.models.lora.trainable_mask``) the parameters are split into the trainable part and the
frozen rest (``lora.partition``); the gradient is taken with respect to the trainable part alone,
the rest entering the loss through ``jax.lax.stop_gradient`` (no weight gradient is computed
for it, and gradient accumulation carries only the trainable part's), and the optimizer sees
only the trainable part: its state must come from
``optimizer.init(split_trainable(params, trainable)[0])``.

Shape legend: B rollout rows, Tp prompt buffer, T completion tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import optax

from rlpost import objectives as obj
from rlpost.models import lora
from rlpost.types import RolloutBatch

if TYPE_CHECKING:
  from rlpost.models.packing import Buckets


def row_chunks(fn: Callable, b: int, chunk: int, live: jax.Array | None = None) -> jax.Array:
  """``fn(rows [chunk] int32) -> [chunk, ...]`` over all B rows in sequential chunks; with
  ``live`` ([B] bool) a chunk without a live row is not run and gives zeros."""
  if chunk >= b:
    return fn(jnp.arange(b))
  run = fn
  if live is not None:
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(fn, jnp.arange(chunk)))
    run = lambda r: jax.lax.cond(jnp.any(live[r]), fn, lambda r: zeros, r)  # noqa: E731
  out = jax.lax.map(run, jnp.arange(b).reshape(-1, chunk))
  return jax.tree.map(lambda x: x.reshape(b, *x.shape[2:]), out)


def split_trainable(params, trainable: Callable | None):
  """(trainable part, frozen rest or None) of ``params`` under the mask ``trainable(params)``
  (None: everything is trainable)."""
  if trainable is None:
    return params, None
  return lora.partition(params, trainable(params))


def join_trainable(train, frozen):
  """The inverse of ``split_trainable``."""
  return train if frozen is None else lora.combine(train, frozen)


def make_update(*, recipe: obj.Recipe, optimizer: optax.GradientTransformation,
                policy_logp: Callable, num_iterations: int, num_minibatches: int,
                grad_accum: int, constrain: Callable = lambda x: x,
                trainable: Callable | None = None,
                packing: "Buckets | None" = None) -> Callable:
  """The update epochs of one step.

  Args:
    recipe: its ``loss_fn`` and ``requires`` (per-token entropy) are used.
    optimizer: an optax transformation.
    policy_logp: ``(params, prompts [R, Tp], pmask, tokens [R, T], tmask, *, entropy,
      num_bins) -> (logp [R, T], entropy [R, T] or None)``, differentiable in ``params``;
      ``num_bins`` None is the padded pass, an int the rows packed into that many bins
      (``rlpost.models.packing``).
    constrain: applied to row-index arrays (the rows' sharding over a mesh).
    trainable: ``params -> mask`` (a prefix tree of bools) of the parameters to train; the rest
      stay bitwise unchanged and get no gradient. None: all.
    packing: ``rlpost.models.packing.Buckets``: each micro-batch's forward and backward pass
      runs over the smallest bucket its rows pack into (one ``lax.switch`` per micro-batch),
      and the stats gain real_tokens and packed_slots. None: padded.

  Returns:
    ``update(params, opt_state, batch, prompts, pmask, adv, key, live=None) -> (params,
    opt_state, stats)`` with ``batch`` a RolloutBatch of B rows, ``adv`` its ``Advantages``,
    ``live`` None or [B] bool (``rlpost.rollouts.allocate.Allocation.live``: the sampled rows of
    a dynamic allocation; mini-batches then split the live rows evenly and micro-batches
    without a valid row run no model pass), and stats
    the mean over updates of the recipe's metrics, loss and grad_norm, plus logp_mismatch: the
    sampler-vs-trainer token log-prob gap of the first mini-batch of the first epoch (the only
    one that sees the sampling parameters).
  """
  needs_entropy = "entropy" in recipe.loss_inputs

  def loss_parts(params, rows, batch, prompts, pmask, adv, num_bins=None, model=True):
    """The recipe's loss over rows ``rows`` as a (sum, denominator) pair, its metrics (also
    pairs) and the log-prob gap as a pair: pairs of disjoint row sets add up. ``model`` False:
    zeros for the log-probs and entropies, without running the policy (for rows that are all
    invalid, whose terms the loss masks out: the same values), and no packed slot or real
    token counted."""
    rows = constrain(rows)
    sub = jax.tree.map(lambda x: x[rows], batch)
    if model:
      logp, ent = policy_logp(params, prompts[rows], pmask[rows], sub.tokens, sub.token_mask,
                              entropy=needs_entropy, num_bins=num_bins)
    else:
      logp = jnp.zeros(sub.tokens.shape, jnp.float32)
      ent = logp if needs_entropy else None
    parts, metrics = recipe.loss_fn(logp, sub, adv.values[rows], adv.weights[rows], entropy=ent)
    if packing is not None:
      pack = packing.metrics(pmask[rows], sub.token_mask)
      if not model:  # no pass ran: no slot computed, no real token seen
        pack = {k: obj.LossParts(jnp.zeros_like(v.sum), v.denominator) for k, v in pack.items()}
      metrics = {**metrics, **pack}
    token_valid = sub.token_mask & sub.valid[:, None]
    gap = jnp.abs(jax.lax.stop_gradient(logp) - sub.behaviour_logp)
    mismatch = obj.LossParts(jnp.sum(jnp.where(token_valid, gap, 0.0)),
                             jnp.sum(token_valid).astype(jnp.float32))
    return parts, (metrics, mismatch)

  def packed(fn, rows, batch, pmask):
    """``fn(num_bins)`` for the bucket the rows pack into (``packing``), or ``fn(None)``."""
    if packing is None:
      return fn(None)
    rows = constrain(rows)
    return packing.run(fn, pmask[rows], batch.token_mask[rows])

  def minibatch_grads(params, rows, *data, skip=False):
    """(loss, metrics, mismatch, grads) of one mini-batch, over grad_accum micro-batches;
    grads are those of the trainable part (``split_trainable``). ``skip``: a micro-batch
    without a valid row runs no forward or backward pass (zero gradient, same loss parts)."""
    train, frozen = split_trainable(params, trainable)
    if frozen is not None:
      frozen = jax.lax.stop_gradient(frozen)
    batch, _, pmask = data[:3]

    def parts_of(t, r, num_bins=None):
      return loss_parts(join_trainable(t, frozen), r, *data, num_bins=num_bins)

    if grad_accum == 1:
      def value_and_grad(num_bins):
        def loss_fn(train):
          parts, aux = parts_of(train, rows, num_bins)
          return obj.finalize(parts), aux
        return jax.value_and_grad(loss_fn, has_aux=True)(train)

      (loss, (metrics, mismatch)), grads = packed(value_and_grad, rows, batch, pmask)
      return loss, metrics, obj.finalize(mismatch), grads

    def micro(acc, r):
      # d(sum)/d(params) per micro-batch; the denominators do not depend on the parameters, so
      # the mini-batch gradient is the summed one over the summed denominator.
      def value_and_grad(num_bins):
        def sum_fn(train):
          parts, aux = parts_of(train, r, num_bins)
          return parts.sum, (parts, aux)
        return jax.value_and_grad(sum_fn, has_aux=True)(train)

      def run():
        return packed(value_and_grad, r, batch, pmask)

      def no_model():
        parts, aux = loss_parts(join_trainable(train, frozen), r, *data, model=False)
        return (parts.sum, (parts, aux)), jax.tree.map(jnp.zeros_like, train)

      (_, out), g = (jax.lax.cond(jnp.any(batch.valid[r]), run, no_model) if skip else run())
      return jax.tree.map(jnp.add, acc, (g, out)), None

    micro_rows = rows.reshape(grad_accum, -1)
    shapes = jax.eval_shape(
        lambda p, r: (jax.grad(lambda q: parts_of(q, r)[0].sum)(p), parts_of(p, r)),
        train, micro_rows[0])
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    (g_sum, (parts, (metrics, mismatch))), _ = jax.lax.scan(micro, zeros, micro_rows)
    grads = jax.tree.map(lambda g: obj.safe_divide(g, parts.denominator), g_sum)
    return obj.finalize(parts), metrics, obj.finalize(mismatch), grads

  def update(params, opt_state, batch: RolloutBatch, prompts, pmask, adv, key, live=None):
    b = batch.batch_size
    mb = b // num_minibatches

    def minibatch_update(carry, rows):
      params, opt_state = carry
      loss, metrics, mismatch, grads = minibatch_grads(params, rows, batch, prompts, pmask, adv,
                                                       skip=live is not None)
      train, frozen = split_trainable(params, trainable)
      updates, opt_state = optimizer.update(grads, opt_state, train)
      params = join_trainable(optax.apply_updates(train, updates), frozen)
      stats = {k: obj.finalize(v) for k, v in metrics.items()}
      stats.update(logp_mismatch=mismatch, loss=loss, grad_norm=optax.tree.norm(grads))
      return (params, opt_state), stats

    def epoch(carry, i):
      perm = jax.random.permutation(jax.random.fold_in(key, i), b)
      if live is None:
        return jax.lax.scan(minibatch_update, carry, perm.reshape(num_minibatches, mb))
      # Live rows first (shuffled), and mini-batch j takes every M-th row from j: the live rows
      # split evenly over the mini-batches and lead each, so the micro-batches after them hold
      # no valid row and are skipped.
      perm = perm[jnp.argsort(~live[perm], stable=True)]
      return jax.lax.scan(minibatch_update, carry, perm.reshape(mb, num_minibatches).T)

    (params, opt_state), stats = jax.lax.scan(epoch, (params, opt_state),
                                              jnp.arange(num_iterations))
    first_mismatch = stats.pop("logp_mismatch")[0, 0]
    stats = jax.tree.map(jnp.mean, stats)
    stats["logp_mismatch"] = first_mismatch
    return params, opt_state, stats

  return update
