"""Named recipes: each paper method is an advantage chain plus a loss configuration.

Shape legend: P prompts, G_max padded group size, B = P * G_max rollouts, T tokens.

A :class:`Recipe` bundles

* ``advantage``: an ``AdvantageTransform`` (a ``chain``); run it with
  ``adv, state = compute_advantages(recipe.advantage, batch, key=key)``;
* ``loss_config``: a frozen :class:`PolicyLossConfig` of explicit hyperparameters;
* ``loss``: the unbound loss function (``policy_loss`` unless the recipe brings its own, see
  ``losses.py``), and ``loss_fn(logp [B, T], batch, advantages [B] or [B, T],
  sample_weight [B], *, entropy=None) -> (LossParts(sum, denominator), metrics)``, i.e. ``loss``
  bound to the config;
* ``requires``: the optional inputs it needs (``ref_logp``, ``entropy``, ...);
  ``recipe.check_provided(fields)`` raises a ValueError naming those a run does not provide.

The trainer is the same for every recipe::

    recipe = get_recipe("dapo", RecipeContext(max_length=1024))
    recipe.check_provided({"ref_logp", "current_logp", "behaviour_logp", "entropy", "key"})
    adv, _ = compute_advantages(recipe.advantage, batch)
    parts, metrics = recipe.loss_fn(logp, batch, adv.values, adv.weights)
    loss = finalize(parts)   # or combine parts over micro-batches first

``get_recipe(name, context=None, **overrides)`` accepts the recipe factory's own keyword
arguments and any ``PolicyLossConfig`` field (e.g. ``kl_coef=0.0``, ``eps_high=0.3``); unknown
names raise a ValueError listing what is accepted. A ``RecipeContext`` carries facts of the run
(``max_length``, ``group_size``): each non-None fact fills the factory's keyword argument of the
same name unless an override sets it; factories without that argument ignore it. Overrides of
``PolicyLossConfig`` fields keep the recipe's own loss function.

A new objective is one file with a factory returning a ``Recipe`` (``make_recipe``) and a
``register_recipe`` call, plus one test (README "Extending rlpost").
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from rlpost import registry, typecheck
from rlpost.objectives import advantages
from rlpost.objectives.base import (AdvantageTransform, Recipe, RecipeContext, chain,
                                    compute_advantages, make_recipe)
from rlpost.objectives.losses import PolicyLossConfig
from rlpost.types import RolloutBatch

__all__ = [
    "Recipe",
    "RecipeContext",
    "make_recipe",
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "gspo_token",
    "gmpo",
    "pnpo",
    "rloo",
    "mc_grpo",
    "ace",
    "dars",
    "register_recipe",
    "get_recipe",
    "list_recipes",
    "default_overlong_buffer",
    "check_override_types",
    "learns_from_singleton_groups",
]


class _Parts(NamedTuple):
  """Stages of a GRPO-family advantage chain, so composite recipes can swap or add stages."""

  shaping: tuple
  center: AdvantageTransform
  scale: AdvantageTransform
  post: tuple
  loss: PolicyLossConfig
  requires: tuple = ()

  def build(self, name: str) -> Recipe:
    adv = chain(*self.shaping, self.center, self.scale, *self.post)
    return make_recipe(name, adv, self.loss, advantage_requires=self.requires)


def _need_max_length(recipe: str, max_length: Optional[int]) -> int:
  if max_length is None:
    raise ValueError(
        f"recipe {recipe!r} needs max_length=<L_max, the maximum completion length in tokens>"
    )
  return int(max_length)


def default_overlong_buffer(max_length: int) -> int:
  """L_c = max(1, L_max // 5): the DAPO paper's ratio (a 4096-token buffer for L_max 20480)."""
  return max(1, int(max_length) // 5)


def _overlong_buffer(max_length: int, overlong_buffer: Optional[int]) -> int:
  return default_overlong_buffer(max_length) if overlong_buffer is None else overlong_buffer


# Base recipes ------------------------------------------------------------------------------------


def _grpo_parts(*, std_eps: float, ddof: int) -> _Parts:
  return _Parts(
      shaping=(),
      center=advantages.center_by_group_mean(),
      scale=advantages.scale_by_group_std(ddof=ddof, eps=std_eps),
      post=(),
      loss=PolicyLossConfig(
          ratio="token",
          eps_low=0.2,
          eps_high=0.2,
          dual_clip=None,
          aggregation="seq_mean_token_mean",
          kl_coef=0.04,
          kl_estimator="k3",
      ),
  )


def _flips(prob: float) -> tuple:
  """The injected sign-flip ablation stage (none when ``prob`` is 0)."""
  return (advantages.flip_signs(prob=prob),) if prob > 0 else ()


def grpo(*, std_eps: float = 1e-6, ddof: int = 1, signflip_prob: float = 0.0) -> Recipe:
  """GRPO (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300).

  A_i = (r_i - mean(r)) / (std(r) + eps); token ratio, PPO clip 0.2, KL to the reference with
  the k3 estimator and coefficient 0.04, sequence-mean of token-means.

  Official code: none public; advantages follow verl ``compute_grpo_outcome_advantage``
  (eps 1e-6, unbiased std); TRL's ``GRPOTrainer`` uses eps 1e-4 (``std_eps=1e-4``) and
  ``beta = 0`` by default (``kl_coef=0.0``). Deviation: a group of size 1 gets A = 0 (verl
  returns the raw score). No dual clip (verl's "vanilla" loss adds one: ``dual_clip=3.0``).

  ``signflip_prob`` > 0 flips each final advantage's sign with that probability (the MC-GRPO
  paper's injected sign-flip ablation, its code's ``signflip_percent``).
  """
  parts = _grpo_parts(std_eps=std_eps, ddof=ddof)
  return parts._replace(post=parts.post + _flips(signflip_prob)).build("grpo")


def gmpo(*, std_eps: float = 1e-6, ddof: int = 1) -> Recipe:
  """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673).

  GRPO advantages; the loss -A_i * exp(mean_t m_t), the geometric mean of token ratios each
  clipped in log space to [-0.4, 0.4] on its advantage's pessimistic side
  (:func:`rlpost.objectives.losses.geo_mean_policy_term`); mean over sequences; no KL, no
  entropy bonus.

  Official code: callsys/GMPO; verl ``compute_policy_loss_geo_mean`` (``loss_mode=geo_mean``
  with ``clip_ratio_low = clip_ratio_high = 0.4``, ``use_kl_loss=False``, as its GMPO example).
  """
  parts = _grpo_parts(std_eps=std_eps, ddof=ddof)
  loss = dataclasses.replace(parts.loss, ratio="geo_mean", eps_low=0.4, eps_high=0.4,
                             kl_coef=0.0)
  return parts._replace(loss=loss).build("gmpo")


def _dr_grpo_parts(*, max_length: int) -> _Parts:
  return _Parts(
      shaping=(),
      center=advantages.center_by_group_mean(),
      scale=advantages.identity(),
      post=(),
      loss=PolicyLossConfig(
          ratio="token",
          eps_low=0.2,
          eps_high=0.2,
          aggregation="seq_sum_const_len",
          max_length=max_length,
          kl_coef=0.0,
      ),
  )


def dr_grpo(*, max_length: Optional[int] = None) -> Recipe:
  """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective").

  A_i = r_i - mean(r) (no std); token sum over a constant length L_max (``max_length``,
  required), i.e. sum of token losses / (#rollouts * L_max); PPO clip 0.2; no KL.

  Official code: sail-sg/understand-r1-zero (oat); TRL ``loss_type="dr_grpo"``.
  """
  return _dr_grpo_parts(max_length=_need_max_length("dr_grpo", max_length)).build("dr_grpo")


def _dapo_parts(*, max_length, overlong_buffer, overlong_penalty_factor, std_eps) -> _Parts:
  return _Parts(
      shaping=(
          advantages.overlong_shaping(
              max_length=max_length,
              buffer_length=overlong_buffer,
              penalty_factor=overlong_penalty_factor,
          ),
      ),
      center=advantages.center_by_group_mean(),
      scale=advantages.scale_by_group_std(ddof=1, eps=std_eps),
      post=(),
      loss=PolicyLossConfig(
          ratio="token",
          eps_low=0.2,
          eps_high=0.28,
          dual_clip=3.0,
          aggregation="token_mean",
          kl_coef=0.0,
      ),
  )


def dapo(
    *,
    max_length: Optional[int] = None,
    overlong_buffer: Optional[int] = None,
    overlong_penalty_factor: float = 1.0,
    std_eps: float = 1e-6,
) -> Recipe:
  """DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale").

  Clip-higher (eps_low 0.2, eps_high 0.28), token-mean over the batch, soft overlong
  punishment in tokens (L_max = ``max_length``, required; L_c = ``overlong_buffer``, 4096 in
  the paper with L_max 20480; None takes the paper's ratio, max(1, L_max // 5)), GRPO
  advantages, no KL.

  Official code: BytedTsinghua-SIA/DAPO (verl ``recipe/dapo``); the verl "vanilla" loss it
  uses applies the dual clip c = 3, kept here. Dynamic sampling (keeping groups with
  0 < #correct < G) is rollout allocation, not part of the objective.
  """
  ml = _need_max_length("dapo", max_length)
  return _dapo_parts(
      max_length=ml,
      overlong_buffer=_overlong_buffer(ml, overlong_buffer),
      overlong_penalty_factor=overlong_penalty_factor,
      std_eps=std_eps,
  ).build("dapo")


def _gspo_parts(*, ratio: str, std_eps: float) -> _Parts:
  return _Parts(
      shaping=(),
      center=advantages.center_by_group_mean(),
      scale=advantages.scale_by_group_std(ddof=1, eps=std_eps),
      post=(),
      loss=PolicyLossConfig(
          ratio=ratio,
          eps_low=3e-4,
          eps_high=4e-4,
          dual_clip=None,
          aggregation="seq_mean_token_mean",
          kl_coef=0.0,
      ),
  )


def gspo(*, std_eps: float = 1e-6) -> Recipe:
  """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization").

  Sequence ratio s_i = exp(mean_t (logp - old)), clipped with eps_low 3e-4, eps_high 4e-4;
  GRPO advantages; sequence mean (seq-mean-token-mean); no KL; log ratio clamped at 10.

  Official code: none from the authors; verl ``compute_policy_loss_gspo`` implements the
  token variant (see :func:`gspo_token`), whose gradient equals this one for sequence-level
  advantages.
  """
  return _gspo_parts(ratio="sequence", std_eps=std_eps).build("gspo")


def gspo_token(*, std_eps: float = 1e-6) -> Recipe:
  """GSPO-token (Zheng et al. 2025, "Group Sequence Policy Optimization").

  s_{i,t} = sg[s_i] * pi_t / sg[pi_t]: the value of the sequence ratio with a per-token
  gradient, allowing token-level advantages. Otherwise identical to :func:`gspo`.

  Official code: none from the authors; verl ``compute_policy_loss_gspo`` implements exactly
  this form (with seq-mean-token-mean aggregation and the log ratio clamped at 10).
  """
  return _gspo_parts(ratio="sequence_token", std_eps=std_eps).build("gspo_token")


def pnpo(*, std_eps: float = 1e-6) -> Recipe:
  """PNPO ("Prefix-Normalized Policy Optimization").

  rho_{i,t} = exp((1/t) sum_{s<=t} (logp_s - old_s)), the geometric mean of token ratios along
  the causal prefix, PPO-clipped; GRPO advantages.

  Official code: none found. The clip range (0.2, 0.2), the sequence-mean-of-token-means
  aggregation and the absence of KL are this library's choices, not published values.
  """
  parts = _grpo_parts(std_eps=std_eps, ddof=1)
  loss = dataclasses.replace(parts.loss, ratio="prefix", kl_coef=0.0)
  return parts._replace(loss=loss).build("pnpo")


def rloo() -> Recipe:
  """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization";
  Kool et al. 2019).

  A_i = r_i - mean_{j != i} r_j (leave-one-out), no scaling; token ratio with PPO clip 0.2
  (identical to REINFORCE when on-policy); sequence-mean of token-means; no KL.

  Official code: none from the authors; advantages as verl ``compute_rloo_outcome_advantage``.
  Deviation: the paper and TRL's RLOO put a KL penalty into the reward; here KL is a loss term
  (``kl_coef``), 0 by default.
  """
  return _Parts(
      shaping=(),
      center=advantages.center_by_leave_one_out(),
      scale=advantages.identity(),
      post=(),
      loss=PolicyLossConfig(
          ratio="token", eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_mean", kl_coef=0.0
      ),
  ).build("rloo")


def _base_parts(base: str, *, max_length, overlong_buffer, recipe: str) -> _Parts:
  if base == "grpo":
    return _grpo_parts(std_eps=1e-6, ddof=1)
  if base == "dr_grpo":
    return _dr_grpo_parts(max_length=_need_max_length(f"{recipe}(base='dr_grpo')", max_length))
  if base == "dapo":
    ml = _need_max_length(f"{recipe}(base='dapo')", max_length)
    return _dapo_parts(
        max_length=ml,
        overlong_buffer=_overlong_buffer(ml, overlong_buffer),
        overlong_penalty_factor=1.0,
        std_eps=1e-6,
    )
  raise ValueError(f"{recipe}: unknown base {base!r}; expected 'grpo', 'dapo' or 'dr_grpo'")


def mc_grpo(
    *,
    base: str = "grpo",
    scale: Optional[str] = None,
    eps: Optional[float] = None,
    baseline: str = "median",
    odd_only: bool = True,
    max_length: Optional[int] = None,
    overlong_buffer: Optional[int] = None,
    signflip_prob: float = 0.0,
    rescale: bool = False,
) -> Recipe:
  """MC-GRPO ("Median-Centered Group Relative Policy Optimization") over GRPO, DAPO or Dr.GRPO.

  Sample G+1 rollouts per prompt (the trainer's job). Default, the official code's rule:
  A_i = (r_i - m) / (MAD + 1e-3) with m the median over all G+1 and
  MAD = median_j |r_j - m|; the pivot (lowest-index rollout with r = m) is removed from the
  loss, so G rollouts contribute; the base recipe's loss and reward shaping are kept.

  Official code: lotusroot-kim/MC-GRPO, ``src/open_r1/grpo_trainer_math.py`` (TRL-based; the
  pivot is ``torch.median``'s index, arbitrary under ties; here deterministic).

  Args:
    base: "grpo", "dapo" or "dr_grpo" (the latter two need ``max_length``).
    scale: "mad" (default with the median baseline), "std" (group std, TRL eps 1e-4; default
      with the mean baseline), "none".
    eps: added to the scale; None: 1e-3 for MAD, 1e-4 for std.
    baseline: "median" (the method); "mean": the official GSM trainer's ``mc=False``
      ablation, mean over all G+1 and the rollout with the smallest |r| dropped (under 0/1
      rewards always a failure when the group has one: a success-biased sample); or
      "mean_random": mean over all G+1 and a uniformly random rollout dropped (an unbiased
      control of the same compute; needs the advantage key).
    rescale: multiply each group's non-zero advantages by (G+1) / (number non-zero), as the
      official GSM trainer does with the median (``rescale_nonzero``; before the exclusion).
    odd_only: remove a pivot only from odd groups (groups shrunk by masking keep all members).
    max_length, overlong_buffer: for the DAPO and Dr.GRPO bases (``overlong_buffer`` None:
      max(1, max_length // 5), as :func:`dapo`).
    signflip_prob: injected sign flips after the pivot exclusion (see ``grpo``).
  """
  parts = _base_parts(
      base, max_length=max_length, overlong_buffer=overlong_buffer, recipe="mc_grpo"
  )
  if baseline == "median":
    scale = "mad" if scale is None else scale
    center = advantages.center_by_group_median(even="lower")
    exclude = advantages.exclude_median_pivot(odd_only=odd_only)
  elif baseline in ("mean", "mean_random"):
    scale = "std" if scale is None else scale
    center = advantages.center_by_group_mean()
    exclude = (advantages.exclude_min_abs_reward() if baseline == "mean"
               else advantages.exclude_random_member())
  else:
    raise ValueError(f"mc_grpo: baseline must be 'median', 'mean' or 'mean_random', got "
                     f"{baseline!r}")
  if scale == "mad":
    scaler = advantages.scale_by_group_mad(eps=1e-3 if eps is None else eps, even="lower")
  elif scale == "std":
    scaler = advantages.scale_by_group_std(ddof=1, eps=1e-4 if eps is None else eps)
  elif scale == "none":
    scaler = advantages.identity()
  else:
    raise ValueError(f"mc_grpo: scale must be 'mad', 'std' or 'none', got {scale!r}")
  post = (parts.post + ((advantages.rescale_nonzero(),) if rescale else ()) + (exclude,)
          + _flips(signflip_prob))
  return parts._replace(center=center, scale=scaler, post=post).build("mc_grpo")


def ace(
    *,
    alpha: Optional[float] = None,
    base: str = "grpo",
    mode: str = "multiplicative",
    fn: str = "softplus",
    logp_source: str = "old",
    max_length: Optional[int] = None,
    overlong_buffer: Optional[int] = None,
) -> Recipe:
  """ACE ("Asymmetric Confidence-aware Error Penalty") over GRPO or DAPO.

  After the base chain, negative advantages are modulated by the confidence shift
  c_i = sum_t (logp - ref_logp) (stop-gradient): A_i (1 + alpha f(c_i)) (multiplicative) or
  A_i - alpha f(c_i) (additive), f = softplus (or relu, the paper's ablation).

  Official code: none public (the paper uses verl); this is the best reading of the paper.
  ``alpha`` has no published default and is required. Needs ``ref_logp`` even with
  ``kl_coef = 0``.
  """
  if alpha is None:
    raise ValueError("recipe 'ace' needs alpha=<float> (no published default; sweep it)")
  if base not in ("grpo", "dapo"):
    raise ValueError(f"ace: unknown base {base!r}; expected 'grpo' or 'dapo'")
  parts = _base_parts(base, max_length=max_length, overlong_buffer=overlong_buffer, recipe="ace")
  mod = advantages.ace_confidence_penalty(alpha=alpha, mode=mode, fn=fn, logp_source=logp_source)
  needs = ("ref_logp", "current_logp") if logp_source == "current" else ("ref_logp",)
  return parts._replace(post=parts.post + (mod,), requires=needs).build("ace")


def dars(*, max_length: Optional[int] = None) -> Recipe:
  """DARS's objective ("Difficulty Adaptive Rollout Sampling"; depth and breadth in RLVR).

  A_i = r_i - mean(group) over the merged group (no std); PPO clip 0.2 with verl's dual clip
  c = 3; token sum over a constant length L_max (``max_length``, required; verl
  "seq-mean-token-sum-norm"); entropy bonus 0.001 (needs ``entropy``); no KL.

  Official code: yangzhch6/DARS (verl fork). The extra-rollout schedule and the dropping of
  groups with merged accuracy 0 or 1 belong to rollout allocation, not to the objective: the
  recipe declares the allocations the paper runs it with, ``dars``, ``dars_b`` and ``plain``
  (its GRPO baselines, which share this objective), and a run names one.
  """
  ml = _need_max_length("dars", max_length)
  return _Parts(
      shaping=(),
      center=advantages.center_by_group_mean(),
      scale=advantages.identity(),
      post=(),
      loss=PolicyLossConfig(
          ratio="token",
          eps_low=0.2,
          eps_high=0.2,
          dual_clip=3.0,
          aggregation="seq_sum_const_len",
          max_length=ml,
          kl_coef=0.0,
          entropy_coef=0.001,
      ),
  ).build("dars").replace(allocations=("dars", "dars_b", "plain"))


# Registry ----------------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Recipe]] = {}
_LOSS_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyLossConfig))


def register_recipe(name: str, factory: Callable[..., Recipe]) -> None:
  """Adds ``factory`` (keyword-only hyperparameters, returns a Recipe) under ``name``.

  A factory argument named like a ``RecipeContext`` field (``max_length``, ``group_size``,
  ``tokenizer``, ``stop_tokens``, ...) receives that run fact from ``get_recipe(name, context)``
  unless the caller overrides it.

  Registering a name again replaces the entry when ``factory`` has the same module and
  qualified name (a re-imported module, a notebook cell run again); another factory under a
  registered name raises ValueError (``rlpost.registry``).
  """
  registry.add(_REGISTRY, name, factory, what="recipe")


def list_recipes() -> tuple:
  """Registered recipe names, sorted."""
  return tuple(sorted(_REGISTRY))


def _context_args(factory: Callable[..., Recipe], context: Optional[RecipeContext]) -> dict:
  """The non-None facts of ``context`` that ``factory`` takes as keyword arguments."""
  if context is None:
    return {}
  if not isinstance(context, RecipeContext):
    raise TypeError(f"context must be a RecipeContext or None, got {type(context).__name__}")
  return registry.facts_for(factory, context.facts())


def get_recipe(name: str, context: Optional[RecipeContext] = None, **overrides) -> Recipe:
  """The recipe ``name`` built for ``context`` with ``overrides``.

  Each override is either a keyword argument of the recipe's factory (e.g. ``max_length``,
  ``alpha``, ``base``) or a ``PolicyLossConfig`` field (e.g. ``kl_coef``, ``eps_high``,
  ``aggregation``), applied after the factory and keeping the recipe's own loss function.
  Each non-None fact of ``context`` (``RecipeContext(max_length=..., group_size=...)``) fills
  the factory's keyword argument of the same name when no override sets it; a factory without
  such an argument ignores it. So ``get_recipe("dapo", RecipeContext(max_length=L))`` is
  ``dapo(max_length=L)`` (overlong buffer max(1, L // 5)), and an explicit ``max_length=``
  override wins over the context.

  Raises ValueError naming an unknown recipe or unknown override keys, with the accepted names.
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown recipe {name!r}; registered recipes: {', '.join(list_recipes())}")
  factory = _REGISTRY[name]
  params = tuple(inspect.signature(factory).parameters)
  unknown = sorted(k for k in overrides if k not in params and k not in _LOSS_FIELDS)
  if unknown:
    raise ValueError(
        f"unknown override(s) {unknown} for recipe {name!r}; recipe arguments: "
        f"{sorted(params)}; loss fields: {sorted(_LOSS_FIELDS)}"
    )
  args = _context_args(factory, context)
  args.update({k: v for k, v in overrides.items() if k in params})
  recipe = factory(**args)
  loss_changes = {k: v for k, v in overrides.items() if k not in params}
  if loss_changes:
    recipe = recipe.with_loss(**loss_changes)
  return recipe.replace(name=name)


def _type_hints(obj: Any) -> dict:
  """``typing.get_type_hints(obj)``, or {} where an annotation cannot be resolved."""
  try:
    return typing.get_type_hints(obj)
  except Exception:  # noqa: BLE001 - unresolvable annotations leave the value unchecked
    return {}


def check_override_types(name: str, overrides: dict) -> None:
  """Raises TypeError naming the first override of ``get_recipe(name, **overrides)`` whose value
  does not have the type its factory argument or ``PolicyLossConfig`` field declares.

  The types come from the factory's annotations (an argument without a usable annotation is
  checked against its default's type where the default is a bool, int, float or string), so a
  registered recipe is checked like the built-in ones. Unknown recipes and override names are
  left to ``get_recipe``, which reports them. Meant for overrides read from a config (JSON
  values); ``get_recipe`` itself does not check types.
  """
  factory = _REGISTRY.get(name)
  if factory is None:
    return
  params = inspect.signature(factory).parameters
  hints = _type_hints(factory)
  loss_hints = _type_hints(PolicyLossConfig)
  for key, value in overrides.items():
    if key in params:
      hint = hints.get(key)
      default = params[key].default
      if hint is None and type(default) in (bool, int, float, str):
        # Without an annotation an integer default may stand for a number (``eps=0``).
        hint = float if type(default) is int else type(default)
    else:
      hint = loss_hints.get(key)
    if hint is not None and not typecheck.matches(value, hint):
      what = "argument" if key in params else "loss field"
      raise TypeError(f"{what} {key!r} of recipe {name!r} must be {typecheck.describe(hint)}, got "
                      f"{value!r}")


def learns_from_singleton_groups(recipe: Recipe) -> bool:
  """Whether ``recipe``'s advantages can be non-zero when every group has a single rollout.

  Runs the recipe's advantage chain on a probe batch of four one-rollout groups with distinct
  rewards and lengths, every optional input given (log-probs, entropy, a PRNG key). A
  group-relative baseline (group mean, median, leave-one-out; GRPO, Dr.GRPO, DAPO, RLOO,
  MC-GRPO, ...) gives every singleton an advantage of exactly 0, so such a recipe's policy
  gradient is 0 with G = 1; a chain with a batch-level baseline or none keeps advantages that
  are not all 0. A chain that cannot run on the probe counts as learning (it cannot be judged
  here, and fails with its own message when it runs).
  """
  b, t = 4, 4
  lengths = jnp.arange(1, b + 1)
  mask = jnp.arange(t)[None, :] < lengths[:, None]
  rewards = jnp.asarray([0.0, 1.0, 0.25, 0.5], jnp.float32)
  logp = jnp.full((b, t), -1.0, jnp.float32)
  batch = RolloutBatch(
      group_id=jnp.arange(b, dtype=jnp.int32),
      valid=jnp.ones((b,), bool),
      tokens=jnp.ones((b, t), jnp.int32),
      token_mask=mask,
      rewards=rewards,
      behaviour_logp=logp,
      current_logp=logp,
      ref_logp=logp - 0.5,
      correct=rewards >= 1.0,
      entropy=jnp.full((b, t), 0.5, jnp.float32),
  )
  try:
    adv, _ = compute_advantages(recipe.advantage, batch, key=jax.random.key(0))
  except Exception:  # noqa: BLE001 - an unjudgeable chain is not refused
    return True
  weights = adv.weights if adv.values.ndim == 1 else adv.weights[:, None]
  return bool(jnp.any((adv.values != 0) & (weights != 0)))


for _name, _factory in (
    ("grpo", grpo),
    ("dr_grpo", dr_grpo),
    ("dapo", dapo),
    ("gspo", gspo),
    ("gspo_token", gspo_token),
    ("gmpo", gmpo),
    ("pnpo", pnpo),
    ("rloo", rloo),
    ("mc_grpo", mc_grpo),
    ("ace", ace),
    ("dars", dars),
):
  register_recipe(_name, _factory)
