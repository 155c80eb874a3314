"""Core types of the objective algebra: advantage transforms, ``chain``, recipes, loss pairs.

Shape legend: B rollouts (P prompts x G_max, see ``rlpost.types``), T tokens.

An advantage transform is a pair of pure functions, the way ``optax.GradientTransformation`` is:

    init() -> state
    update(adv: Advantages, state, batch: RolloutBatch, key: PRNGKey | None) -> (Advantages, state)

``Advantages`` carries the per-rollout values [B] (starting from the rewards) and the per-rollout
loss weights [B] (starting from the validity mask). Group statistics always use ``batch.valid``
(group membership), never the loss weights, so a member excluded from the loss (MC-GRPO's pivot)
still counts in its group's baseline, as in the official code. State, when a transform has any,
is a NamedTuple that travels in the training carry; stateless transforms use ``EmptyState``.

A ``Recipe`` names an advantage chain together with a ``PolicyLossConfig`` and the bound loss
function; losses return ``LossParts(sum, denominator)`` pairs (see ``losses.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Sequence

import chex
import jax
import jax.numpy as jnp

from rlpost.types import RolloutBatch, check_shapes

if TYPE_CHECKING:
  from rlpost.objectives.losses import PolicyLossConfig

__all__ = [
    "Advantages",
    "AdvantageTransform",
    "EmptyState",
    "ChainState",
    "stateless",
    "identity",
    "chain",
    "init_advantages",
    "compute_advantages",
    "Recipe",
    "make_recipe",
    "LossParts",
    "safe_divide",
    "finalize",
    "combine",
    "finalize_metrics",
]


class Advantages(NamedTuple):
  """Per-rollout advantages and loss weights.

  Attributes:
    values: [B] float32 advantages (rewards before any transform).
    weights: [B] float32 loss weights (``valid`` as 0/1 before any transform); a rollout with
      weight 0 contributes neither to a loss sum nor to its denominator.
  """

  values: jax.Array
  weights: jax.Array


class EmptyState(NamedTuple):
  """State of a stateless transform."""


class ChainState(NamedTuple):
  """State of ``chain``: one entry per transform."""

  inner: tuple


UpdateFn = Callable[[Advantages, Any, RolloutBatch, Optional[jax.Array]], "tuple[Advantages, Any]"]


class AdvantageTransform(NamedTuple):
  """A pure advantage transform (see the module docstring).

  Attributes:
    init: ``() -> state``.
    update: ``(adv, state, batch, key) -> (adv, state)``; ``key`` is a PRNG key or None and
      only transforms that say so need one.
  """

  init: Callable[[], Any]
  update: UpdateFn


def stateless(
    fn: Callable[[Advantages, RolloutBatch, Optional[jax.Array]], Advantages],
) -> AdvantageTransform:
  """Wraps ``fn(adv, batch, key) -> adv`` as a transform with ``EmptyState``."""

  def update(adv, state, batch, key=None):
    return fn(adv, batch, key), state

  return AdvantageTransform(init=EmptyState, update=update)


def identity() -> AdvantageTransform:
  """The transform that changes nothing."""
  return stateless(lambda adv, batch, key: adv)


def chain(*transforms: AdvantageTransform) -> AdvantageTransform:
  """Applies ``transforms`` in order, like ``optax.chain``.

  When a key is given, transform ``i`` receives ``jax.random.fold_in(key, i)``; otherwise None.
  """
  transforms = tuple(transforms)

  def init():
    return ChainState(tuple(t.init() for t in transforms))

  def update(adv, state, batch, key=None):
    new_states = []
    for i, (t, s) in enumerate(zip(transforms, state.inner, strict=True)):
      sub = None if key is None else jax.random.fold_in(key, i)
      adv, s = t.update(adv, s, batch, sub)
      new_states.append(s)
    return adv, ChainState(tuple(new_states))

  return AdvantageTransform(init=init, update=update)


def init_advantages(batch: RolloutBatch) -> Advantages:
  """The starting point of every chain: values = rewards (0 on invalid rows), weights = valid."""
  check_shapes(batch)
  valid = batch.valid
  values = jnp.where(valid, batch.rewards.astype(jnp.float32), 0.0)
  return Advantages(values=values, weights=valid.astype(jnp.float32))


def compute_advantages(
    transform: AdvantageTransform,
    batch: RolloutBatch,
    state: Any = None,
    *,
    key: Optional[jax.Array] = None,
) -> tuple[Advantages, Any]:
  """Runs ``transform`` from the rewards of ``batch``.

  Args:
    transform: an AdvantageTransform (typically a ``chain``).
    batch: RolloutBatch with B rows.
    state: the transform's state; None means ``transform.init()``.
    key: PRNG key for transforms that sample (e.g. ``flip_signs``), or None.

  Returns:
    (Advantages(values [B] float32, weights [B] float32), new state). Invalid rows always
    come back with value 0 and weight 0. The values are constants for the loss (the loss
    applies ``stop_gradient``).
  """
  adv = init_advantages(batch)
  if state is None:
    state = transform.init()
  adv, state = transform.update(adv, state, batch, key)
  chex.assert_shape([adv.values, adv.weights], (batch.batch_size,))
  valid = batch.valid
  adv = Advantages(
      values=jnp.where(valid, adv.values, 0.0).astype(jnp.float32),
      weights=jnp.where(valid, adv.weights, 0.0).astype(jnp.float32),
  )
  return adv, state


class Recipe(NamedTuple):
  """A named objective: advantage chain + loss config + bound loss function.

  Attributes:
    name: registry name.
    advantage: AdvantageTransform run by ``compute_advantages``.
    loss_config: PolicyLossConfig.
    loss_fn: ``policy_loss`` with ``config=loss_config`` bound.
    advantage_requires: optional RolloutBatch fields (or "key") the advantage chain needs.
  """

  name: str
  advantage: AdvantageTransform
  loss_config: PolicyLossConfig
  loss_fn: Callable
  advantage_requires: tuple = ()

  @property
  def requires(self) -> tuple:
    """Inputs beyond tokens, masks, rewards and old log-probs, among "ref_logp", "entropy",
    "current_logp", "behaviour_logp" and "key"."""
    req = set(self.advantage_requires)
    cfg = self.loss_config
    if cfg.needs_ref_logp:
      req.add("ref_logp")
    if cfg.needs_entropy:
      req.add("entropy")
    if cfg.tis_cap is not None:
      req.update(("current_logp", "behaviour_logp"))
    return tuple(sorted(req))

  def with_loss(self, **changes) -> "Recipe":
    """The same recipe with ``PolicyLossConfig`` fields replaced (validated)."""
    return make_recipe(
        self.name,
        self.advantage,
        dataclasses.replace(self.loss_config, **changes),
        advantage_requires=self.advantage_requires,
    )


def make_recipe(
    name: str,
    advantage: AdvantageTransform,
    loss_config: PolicyLossConfig,
    *,
    advantage_requires: Sequence[str] = (),
) -> Recipe:
  """Builds a Recipe, binding ``policy_loss`` to ``loss_config``.

  Args:
    name: registry name.
    advantage: the advantage chain.
    loss_config: a ``PolicyLossConfig``.
    advantage_requires: optional batch fields the chain reads (e.g. ("ref_logp",) for ACE).
  """
  from rlpost.objectives.losses import policy_loss  # losses imports this module

  return Recipe(
      name=name,
      advantage=advantage,
      loss_config=loss_config,
      loss_fn=functools.partial(policy_loss, config=loss_config),
      advantage_requires=tuple(advantage_requires),
  )


class LossParts(NamedTuple):
  """A loss or metric as a (sum, denominator) pair of float32 scalars.

  Parts from micro-batches, accumulation steps or data-parallel shards combine exactly by
  adding sums and denominators: ``loss = sum(sums) / sum(denominators)``. Denominators never
  depend on the parameters, so the gradient combines the same way.
  """

  sum: jax.Array
  denominator: jax.Array


def safe_divide(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den, or 0 where den == 0, with finite gradients everywhere."""
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def finalize(parts: LossParts) -> jax.Array:
  """The scalar value of a (sum, denominator) pair: sum / denominator (0 if denominator is 0)."""
  return safe_divide(parts.sum, parts.denominator)


def combine(parts: Sequence[LossParts]) -> LossParts:
  """Adds pairs from disjoint row sets (micro-batches, shards): (sum of sums, sum of denoms)."""
  parts = list(parts)
  if not parts:
    raise ValueError("combine needs at least one LossParts")
  total, den = parts[0]
  for p in parts[1:]:
    total, den = total + p.sum, den + p.denominator
  return LossParts(sum=total, denominator=den)


def finalize_metrics(metrics: dict) -> dict:
  """Maps every LossParts value of a metrics dict to its scalar; other values pass through."""
  return {k: finalize(v) if isinstance(v, LossParts) else v for k, v in metrics.items()}
