"""The optimizer part of an RL step, as a pure function of its inputs.

``make_update(...)`` returns ``update(params, opt_state, batch, prompts, pmask, adv, key)
-> (params, opt_state, stats)``: ``num_iterations`` epochs over ``num_minibatches`` shuffled
mini-batches of the rollout rows, each mini-batch's gradient accumulated over ``grad_accum``
micro-batches. Losses are (sum, denominator) pairs (``rlpost.objectives.LossParts``) whose
denominators do not depend on the parameters, so a mini-batch's loss and gradient are the same
whatever ``grad_accum`` is.

Shape legend: B rollout rows, Tp prompt buffer, T completion tokens.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from rlpost import objectives as obj
from rlpost.types import RolloutBatch


def row_chunks(fn: Callable, b: int, chunk: int) -> jax.Array:
  """``fn(rows [chunk] int32) -> [chunk, ...]`` over all B rows in sequential chunks."""
  if chunk >= b:
    return fn(jnp.arange(b))
  out = jax.lax.map(fn, jnp.arange(b).reshape(-1, chunk))
  return jax.tree.map(lambda x: x.reshape(b, *x.shape[2:]), out)


def make_update(*, recipe: obj.Recipe, optimizer: optax.GradientTransformation,
                policy_logp: Callable, num_iterations: int, num_minibatches: int,
                grad_accum: int, constrain: Callable = lambda x: x) -> Callable:
  """The update epochs of one step.

  Args:
    recipe: its ``loss_fn`` and ``requires`` (per-token entropy) are used.
    optimizer: an optax transformation.
    policy_logp: ``(params, prompts [R, Tp], pmask, tokens [R, T], tmask, *, entropy) ->
      (logp [R, T], entropy [R, T] or None)``, differentiable in ``params``.
    constrain: applied to row-index arrays (the rows' sharding over a mesh).

  Returns:
    ``update(params, opt_state, batch, prompts, pmask, adv, key) -> (params, opt_state,
    stats)`` with ``batch`` a RolloutBatch of B rows, ``adv`` its ``Advantages``, and stats
    the mean over updates of the recipe's metrics, loss and grad_norm, plus logp_mismatch: the
    sampler-vs-trainer token log-prob gap of the first mini-batch of the first epoch (the only
    one that sees the sampling parameters).
  """
  needs_entropy = "entropy" in recipe.loss_inputs

  def loss_parts(params, rows, batch, prompts, pmask, adv):
    """The recipe's loss over rows ``rows`` as a (sum, denominator) pair, its metrics (also
    pairs) and the log-prob gap as a pair: pairs of disjoint row sets add up."""
    rows = constrain(rows)
    sub = jax.tree.map(lambda x: x[rows], batch)
    logp, ent = policy_logp(params, prompts[rows], pmask[rows], sub.tokens, sub.token_mask,
                            entropy=needs_entropy)
    parts, metrics = recipe.loss_fn(logp, sub, adv.values[rows], adv.weights[rows], entropy=ent)
    tok = sub.token_mask & sub.valid[:, None]
    gap = jnp.abs(jax.lax.stop_gradient(logp) - sub.behaviour_logp)
    mismatch = obj.LossParts(jnp.sum(jnp.where(tok, gap, 0.0)), jnp.sum(tok).astype(jnp.float32))
    return parts, (metrics, mismatch)

  def minibatch_grads(params, rows, *data):
    """(loss, metrics, mismatch, grads) of one mini-batch, over grad_accum micro-batches."""
    if grad_accum == 1:
      def loss_fn(params):
        parts, aux = loss_parts(params, rows, *data)
        return obj.finalize(parts), aux

      (loss, (metrics, mismatch)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      return loss, metrics, obj.finalize(mismatch), grads

    def micro(acc, r):
      # d(sum)/d(params) per micro-batch; the denominators do not depend on the parameters, so
      # the mini-batch gradient is the summed one over the summed denominator.
      def sum_fn(params):
        parts, aux = loss_parts(params, r, *data)
        return parts.sum, (parts, aux)

      (_, out), g = jax.value_and_grad(sum_fn, has_aux=True)(params)
      return jax.tree.map(jnp.add, acc, (g, out)), None

    micro_rows = rows.reshape(grad_accum, -1)
    shapes = jax.eval_shape(
        lambda p, r: (jax.grad(lambda q: loss_parts(q, r, *data)[0].sum)(p),
                      loss_parts(p, r, *data)), params, micro_rows[0])
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    (g_sum, (parts, (metrics, mismatch))), _ = jax.lax.scan(micro, zeros, micro_rows)
    grads = jax.tree.map(lambda g: obj.safe_divide(g, parts.denominator), g_sum)
    return obj.finalize(parts), metrics, obj.finalize(mismatch), grads

  def update(params, opt_state, batch: RolloutBatch, prompts, pmask, adv, key):
    b = batch.batch_size
    mb = b // num_minibatches

    def minibatch_update(carry, rows):
      params, opt_state = carry
      loss, metrics, mismatch, grads = minibatch_grads(params, rows, batch, prompts, pmask, adv)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      stats = {k: obj.finalize(v) for k, v in metrics.items()}
      stats.update(logp_mismatch=mismatch, loss=loss, grad_norm=optax.tree.norm(grads))
      return (params, opt_state), stats

    def epoch(carry, i):
      perm = jax.random.permutation(jax.random.fold_in(key, i), b)
      return jax.lax.scan(minibatch_update, carry, perm.reshape(num_minibatches, mb))

    (params, opt_state), stats = jax.lax.scan(epoch, (params, opt_state),
                                              jnp.arange(num_iterations))
    first_mismatch = stats.pop("logp_mismatch")[0, 0]
    stats = jax.tree.map(jnp.mean, stats)
    stats["logp_mismatch"] = first_mismatch
    return params, opt_state, stats

  return update
