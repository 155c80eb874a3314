"""Core types of the objective algebra: advantage transforms, ``chain``, recipes, loss pairs.

Shape legend: B rollouts (P prompts x G_max, see ``rlpost.types``), T tokens.

An advantage transform is a pair of pure functions, the way ``optax.GradientTransformation`` is:

    init() -> state
    update(adv: Advantages, state, batch: RolloutBatch, key: PRNGKey | None) -> (Advantages, state)

``Advantages`` carries the advantage values (starting from the rewards, [B]) and the per-rollout
loss weights [B] (starting from the validity mask). Values are per rollout [B] or, once a
token-level transform has run, per token [B, T]; weights stay [B]. Group statistics always use
``batch.valid`` (group membership), never the loss weights, so a member excluded from the loss
(MC-GRPO's pivot) still counts in its group's baseline, as in the official code. State, when a
transform has any, is a NamedTuple that travels in the training carry; stateless transforms use
``EmptyState``.

A ``Recipe`` names an advantage chain together with a ``PolicyLossConfig`` and an (unbound) loss
function, ``policy_loss`` unless the recipe brings its own; losses return
``LossParts(sum, denominator)`` pairs (``parts.py``, re-exported here).

Module layering (no import circle): ``parts`` <- ``ratios`` <- ``losses`` <- ``base`` <-
``advantages`` <- ``recipes``; ``groups`` and ``rlpost.types`` sit at the bottom beside ``parts``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

from rlpost.objectives.losses import PolicyLossConfig, policy_loss
from rlpost.objectives.parts import LossParts, combine, finalize, finalize_metrics, safe_divide
from rlpost.types import RolloutBatch, check_shapes

__all__ = [
    "Advantages",
    "AdvantageTransform",
    "EmptyState",
    "ChainState",
    "stateless",
    "report",
    "identity",
    "chain",
    "init_advantages",
    "compute_advantages",
    "OPTIONAL_INPUTS",
    "Recipe",
    "RecipeContext",
    "make_recipe",
    "LossParts",
    "safe_divide",
    "finalize",
    "combine",
    "finalize_metrics",
]


class Advantages(NamedTuple):
  """Advantages and per-rollout loss weights.

  Attributes:
    values: [B] float32 per-rollout advantages (rewards before any transform), or [B, T]
      float32 per-token advantages after a token-level transform.
    weights: [B] float32 loss weights (``valid`` as 0/1 before any transform); a rollout with
      weight 0 contributes neither to a loss sum nor to its denominator.
    metrics: a dict of named [] arrays a transform reports (``report``), or None for none;
      ``chain`` keeps every stage's, and the trainer writes them to ``metrics.jsonl`` and the
      trackers under their names.
  """

  values: jax.Array
  weights: jax.Array
  metrics: Optional[dict] = None


def report(adv: Advantages, **metrics) -> Advantages:
  """``adv`` with ``metrics`` ([] arrays, by name) added to those it reports."""
  return adv._replace(metrics={**(adv.metrics or {}), **metrics})


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
    new_states, metrics = [], dict(adv.metrics or {})
    for i, (t, s) in enumerate(zip(transforms, state.inner, strict=True)):
      sub = None if key is None else jax.random.fold_in(key, i)
      adv, s = t.update(adv, s, batch, sub)
      metrics.update(adv.metrics or {})  # a stage that builds a new Advantages keeps reports
      adv = adv._replace(metrics=dict(metrics) or None)
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
    batch: RolloutBatch with B rows and T tokens.
    state: the transform's state; None means ``transform.init()``.
    key: PRNG key for transforms that sample (e.g. ``flip_signs``), or None.

  Returns:
    (Advantages(values [B] or [B, T] float32, weights [B] float32), new state). Invalid rows
    always come back with value 0 and weight 0, and [B, T] values are 0 on masked tokens
    (``token_mask`` False). The values are constants for the loss (the loss applies
    ``stop_gradient``). Raises ValueError if the chain returns other shapes.
  """
  adv = init_advantages(batch)
  if state is None:
    state = transform.init()
  adv, state = transform.update(adv, state, batch, key)
  b, t = batch.batch_size, batch.seq_len
  shapes = (tuple(jnp.shape(adv.values)), tuple(jnp.shape(adv.weights)))
  if shapes[0] not in ((b,), (b, t)) or shapes[1] != (b,):
    raise ValueError(
        f"the advantage chain returned values of shape {shapes[0]} and weights of shape "
        f"{shapes[1]}; expected values (B,) = {(b,)} or (B, T) = {(b, t)} and weights "
        f"(B,) = {(b,)}"
    )
  valid = batch.valid
  keep = valid if shapes[0] == (b,) else batch.token_mask & valid[:, None]
  adv = Advantages(
      values=jnp.where(keep, adv.values, 0.0).astype(jnp.float32),
      weights=jnp.where(valid, adv.weights, 0.0).astype(jnp.float32),
      metrics={k: jnp.asarray(v, jnp.float32) for k, v in (adv.metrics or {}).items()},
  )
  return adv, state


# Recipes -----------------------------------------------------------------------------------------

# The inputs a recipe may need beyond tokens, masks, rewards and the sampler's log-probs:
# RolloutBatch fields, the loss's ``entropy`` argument / ``batch.entropy``, and a PRNG key.
OPTIONAL_INPUTS = ("behaviour_logp", "current_logp", "entropy", "key", "ref_logp")


def _check_inputs(what: str, names: Iterable[str]) -> tuple:
  names = tuple(names)
  unknown = sorted(set(names) - set(OPTIONAL_INPUTS))
  if unknown:
    raise ValueError(f"{what}: unknown input(s) {unknown}; expected some of {OPTIONAL_INPUTS}")
  return names


@dataclasses.dataclass(frozen=True)
class RecipeContext:
  """Facts of a run that recipe factories may need; ``get_recipe`` passes each non-None fact
  to the factory's keyword argument of the same name unless the caller overrides it.

  Each fact is None where the run does not know it yet: a config is validated (and its recipe
  built once) before the data and the tokenizer are loaded.

  Attributes:
    max_length: L_max, the maximum completion length in tokens (the sampler's
      ``max_new_tokens``), or None.
    group_size: G, rollouts sampled per prompt, or None.
    num_prompts: P, prompts per step, or None.
    rows: R, rows of the step's batch (the allocation's plan: P * G for plain allocation, more
      with DARS's stage 2), or None.
    prompt_length: Tp, the prompt buffer in tokens, or None.
    tokenizer: the run's tokenizer (``rlpost.tokenizer.Tokenizer``: ``encode``, ``decode``,
      ``vocab_size``), or None.
    stop_tokens: the token ids that end a completion (tuple of int), or None; a factory
      argument named ``stop_ids`` receives it too (``registry.RENAMED_FACTS``).
    pad_id: the padding token id, or None.
  """

  max_length: Optional[int] = None
  group_size: Optional[int] = None
  num_prompts: Optional[int] = None
  rows: Optional[int] = None
  prompt_length: Optional[int] = None
  tokenizer: Any = None
  stop_tokens: Optional[tuple] = None
  pad_id: Optional[int] = None

  def facts(self) -> dict:
    """The known (non-None) facts by name."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None}


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A named objective: advantage chain + loss config + loss function.

  Attributes:
    name: registry name.
    advantage: AdvantageTransform run by ``compute_advantages``.
    loss_config: PolicyLossConfig (a fork may subclass it to add fields).
    loss: the unbound loss function, ``loss(logp [B, T], batch, advantages [B] or [B, T],
      sample_weight [B], *, config, entropy=None) -> (LossParts, metrics)``; ``policy_loss``
      by default.
    advantage_requires: optional inputs the advantage chain reads (names in
      ``OPTIONAL_INPUTS``; "entropy" means ``batch.entropy``).
    loss_requires: optional inputs ``loss`` reads beyond those ``loss_config`` implies
      ("entropy" means the loss's ``entropy`` argument).
    allocations: the rollout allocation rules (``rlpost.rollouts.allocate``) the recipe's paper
      runs it with, its own first; a run must name one of them. () (the default): any rule.
  """

  name: str
  advantage: AdvantageTransform
  loss_config: PolicyLossConfig
  loss: Callable = policy_loss
  advantage_requires: tuple = ()
  loss_requires: tuple = ()
  allocations: tuple = ()

  @functools.cached_property
  def loss_fn(self) -> Callable:
    """``loss`` with ``config=loss_config`` bound: ``loss_fn(logp, batch, advantages,
    sample_weight, *, entropy=None) -> (LossParts, metrics)`` (the same object on every
    access)."""
    return functools.partial(self.loss, config=self.loss_config)

  @property
  def loss_inputs(self) -> tuple:
    """Optional inputs of the loss function: ``loss_requires`` plus what ``loss_config``
    implies ("ref_logp" for a KL term, "entropy" for an entropy bonus, "current_logp" and
    "behaviour_logp" for TIS), sorted."""
    req = set(self.loss_requires)
    cfg = self.loss_config
    if cfg.needs_ref_logp:
      req.add("ref_logp")
    if cfg.needs_entropy:
      req.add("entropy")
    if cfg.tis_cap is not None:
      req.update(("current_logp", "behaviour_logp"))
    return tuple(sorted(req))

  @property
  def requires(self) -> tuple:
    """Inputs beyond tokens, masks, rewards and old log-probs, among "ref_logp", "entropy",
    "current_logp", "behaviour_logp" and "key": ``advantage_requires`` and ``loss_inputs``,
    sorted."""
    return tuple(sorted(set(self.advantage_requires) | set(self.loss_inputs)))

  def check_provided(self, provided: Iterable[str]) -> None:
    """Raises ValueError naming the recipe and every input of ``requires`` not in
    ``provided`` (e.g. {"ref_logp", "current_logp", "behaviour_logp", "entropy", "key"})."""
    provided = set(provided)
    missing = [r for r in self.requires if r not in provided]
    if missing:
      raise ValueError(
          f"recipe {self.name!r} needs {', '.join(missing)}, which this run does not provide "
          f"(provided: {', '.join(sorted(provided)) or 'none'})"
      )

  def replace(self, **changes) -> "Recipe":
    """The recipe with fields replaced (``dataclasses.replace``)."""
    return dataclasses.replace(self, **changes)

  _replace = replace  # NamedTuple-style spelling

  def with_loss(self, **changes) -> "Recipe":
    """The same recipe (its own loss function included) with ``loss_config`` fields replaced
    (validated by the config)."""
    return self.replace(loss_config=dataclasses.replace(self.loss_config, **changes))


def make_recipe(
    name: str,
    advantage: AdvantageTransform,
    loss_config: PolicyLossConfig,
    *,
    loss: Callable = policy_loss,
    advantage_requires: Sequence[str] = (),
    loss_requires: Sequence[str] = (),
    allocations: Sequence[str] = (),
) -> Recipe:
  """Builds a Recipe; ``recipe.loss_fn`` is ``loss`` with ``config=loss_config`` bound.

  Args:
    name: registry name.
    advantage: the advantage chain.
    loss_config: a ``PolicyLossConfig``.
    loss: the loss function (signature in :class:`Recipe`); ``policy_loss`` by default. A fork
      composes its own from the terms in ``losses`` (see that module's docstring).
    advantage_requires: optional inputs the chain reads (e.g. ("ref_logp",) for ACE,
      ("entropy",) for a chain reading ``batch.entropy``); names in ``OPTIONAL_INPUTS``.
    loss_requires: optional inputs ``loss`` reads beyond those ``loss_config`` implies.
    allocations: the allocation rules the recipe runs with, its own first (a run must name
      one); () for any.
  """
  if not callable(loss):
    raise TypeError(f"make_recipe({name!r}): loss must be callable, got {type(loss).__name__}")
  return Recipe(
      name=name,
      advantage=advantage,
      loss_config=loss_config,
      loss=loss,
      advantage_requires=_check_inputs(f"recipe {name!r} advantage_requires", advantage_requires),
      loss_requires=_check_inputs(f"recipe {name!r} loss_requires", loss_requires),
      allocations=tuple(allocations),
  )
