"""Advantage transforms: reward shaping, baselines, scaling, pivots, ACE, clipping, sign flips.

Shape legend: P prompts, G_max padded group size, B = P * G_max rollouts, T tokens. Every transform
reads group membership from ``batch.group_id`` / ``batch.valid`` (``rlpost.types.RolloutBatch``)
and works on ``Advantages(values [B] float32, weights [B] float32)``; see ``base.py`` for the
protocol. Values may become token-level [B, T] (a fork's transform); reward shaping, baselines,
scalings and the median pivot need per-rollout values [B] (they raise a ValueError otherwise), so
token-level transforms come after them, while ``exclude_min_abs_reward``, the ACE penalty,
``clip_advantages`` and ``flip_signs`` accept either shape (one decision per rollout). All
factories take explicit keyword hyperparameters and return an ``AdvantageTransform``;
``group_baseline`` and ``group_scale`` dispatch on a string for config-driven use.

Conventions (documented once, tested):
  * All-equal groups (including groups of size 1) get advantage exactly 0 from every baseline,
    never NaN, whatever the scaling.
  * A group of size 1 therefore gets A = 0 under the mean, median and leave-one-out baselines.
    (verl instead returns the raw score for singletons, using mean 0 and std 1.) Scaling by the
    group std leaves a value unchanged (divides by 1) where the std is undefined (n <= ddof).
  * Scalings are shift-invariant (std, MAD), so they can follow any baseline.
  * Pivots are chosen deterministically: the lowest batch index among tied candidates.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rlpost.objectives import groups
from rlpost.objectives.base import (AdvantageTransform, Advantages, identity, report,
                                    stateless)
from rlpost.types import RolloutBatch

__all__ = [
    "overlong_penalty",
    "overlong_shaping",
    "center_by_group_mean",
    "center_by_group_median",
    "center_by_leave_one_out",
    "group_baseline",
    "scale_by_group_std",
    "scale_by_group_mad",
    "scale_by_batch_std",
    "group_scale",
    "exclude_median_pivot",
    "exclude_min_abs_reward",
    "exclude_random_member",
    "rescale_nonzero",
    "confidence_shift",
    "ace_modulate",
    "ace_confidence_penalty",
    "clip_advantages",
    "flip_signs",
]


def _replace_values(adv: Advantages, values: jax.Array) -> Advantages:
  return adv._replace(values=values.astype(jnp.float32))


def _share(flags: jax.Array, among: jax.Array) -> jax.Array:
  """[] float32: the share of ``among`` rows where ``flags`` holds (0 when none)."""
  n = jnp.sum(among, dtype=jnp.float32)
  return jnp.where(n > 0, jnp.sum(flags & among, dtype=jnp.float32) / jnp.maximum(n, 1.0), 0.0)


def _rows(what: str, adv: Advantages) -> jax.Array:
  """``adv.values`` if they are per rollout [B]; a ValueError naming ``what`` otherwise."""
  if adv.values.ndim != 1:
    raise ValueError(
        f"{what} needs per-rollout advantage values [B], got shape {adv.values.shape}; place "
        "token-level transforms after the group statistics"
    )
  return adv.values


def _per_row(x: jax.Array, like: jax.Array) -> jax.Array:
  """A per-rollout array [B] shaped to broadcast against ``like`` ([B] or [B, T])."""
  return x if like.ndim == 1 else x[:, None]


# Reward shaping ----------------------------------------------------------------------------------


def overlong_penalty(
    lengths: jax.Array, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> jax.Array:
  """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), counted in tokens.

      penalty(|y|) = 0                                   if |y| <= L_max - L_c
                   = ((L_max - L_c) - |y|) / L_c         if L_max - L_c < |y| <= L_max
                   = -1                                  if |y| > L_max
  times ``penalty_factor``.

  Args:
    lengths: [B] int completion lengths |y| in tokens.
    max_length: L_max, the maximum completion length.
    buffer_length: L_c, the punishment buffer (0 < L_c <= L_max).
    penalty_factor: scale of the penalty (verl's ``overlong_penalty_factor``, 1.0 in DAPO).

  Returns:
    [B] float32 penalties in [-penalty_factor, 0].
  """
  chex.assert_rank(lengths, 1)
  if not 0 < buffer_length <= max_length:
    raise ValueError(
        f"overlong shaping needs 0 < buffer_length <= max_length, got buffer_length="
        f"{buffer_length}, max_length={max_length}"
    )
  expected = max_length - buffer_length
  raw = (expected - lengths.astype(jnp.float32)) / float(buffer_length)
  return penalty_factor * jnp.clip(raw, -1.0, 0.0)


def overlong_shaping(
    *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> AdvantageTransform:
  """Adds :func:`overlong_penalty` of each rollout's token length to its value (DAPO).

  Place it before the baseline so the shaped reward enters the group statistics, as in DAPO's
  reward manager.
  """
  overlong_penalty(
      jnp.zeros((1,), jnp.int32), max_length=max_length, buffer_length=buffer_length
  )  # validates eagerly

  def fn(adv, batch, key):
    pen = overlong_penalty(
        batch.lengths,
        max_length=max_length,
        buffer_length=buffer_length,
        penalty_factor=penalty_factor,
    )
    v = _rows("overlong_shaping", adv)
    return _replace_values(adv, v + jnp.where(batch.valid, pen, 0.0))

  return stateless(fn)


# Baselines ---------------------------------------------------------------------------------------


def center_by_group_mean() -> AdvantageTransform:
  """A_i = v_i - mean_{j in group, valid} v_j (GRPO, Dr.GRPO, DAPO, DARS).

  Exactly 0 for all-equal groups and groups of size 1.
  """

  def fn(adv, batch, key):
    v = _rows("center_by_group_mean", adv)
    mean = groups.group_mean(v, batch.group_id, batch.valid)
    return _replace_values(adv, v - mean)

  return stateless(fn)


def center_by_group_median(*, even: str = "lower") -> AdvantageTransform:
  """A_i = v_i - median_{j in group, valid} v_j (MC-GRPO, Kim et al. 2025).

  Reports ``median_sign_flips``: the share of valid rollouts with v_i != mean whose advantage
  has the opposite sign of v_i - mean (the group mean baseline's), and ``median_zeroed``: the
  share of them the median sets to 0 (the pivot among them). MC-GRPO's point is that these
  differ from the mean's signs in small groups.

  Args:
    even: "lower" (``torch.median``, as in the MC-GRPO code) or "mean" (``numpy.median``) for
      groups with an even number of valid members; odd groups have a unique median.
  """

  def fn(adv, batch, key):
    v, gid, valid = _rows("center_by_group_median", adv), batch.group_id, batch.valid
    med = groups.group_median(v, gid, valid, even=even)
    ref = jnp.sign(v - groups.group_mean(v, gid, valid))
    a = v - med
    counted = valid & (ref != 0)
    out = _replace_values(adv, a)
    return report(out, median_sign_flips=_share((a != 0) & (jnp.sign(a) == -ref), counted),
                  median_zeroed=_share(a == 0, counted))

  return stateless(fn)


def center_by_leave_one_out() -> AdvantageTransform:
  """A_i = v_i - mean_{j != i} v_j over valid group members (RLOO, Ahmadian et al. 2024).

  Equal to n/(n-1) * (v_i - mean). A group of size 1 (no other member) gets A = 0, and so does
  an all-equal group (exactly).
  """

  def fn(adv, batch, key):
    v, gid, valid = _rows("center_by_leave_one_out", adv), batch.group_id, batch.valid
    s = groups.group_sum(v, gid, valid)
    n = groups.group_count(gid, valid)
    loo = (s - v) / jnp.maximum(n - 1.0, 1.0)
    a = jnp.where(n > 1, v - loo, 0.0)
    a = jnp.where(groups.group_all_equal(v, gid, valid), 0.0, a)
    return _replace_values(adv, a)

  return stateless(fn)


def group_baseline(kind: str, *, even: str = "lower") -> AdvantageTransform:
  """Dispatches a baseline by name: "mean", "median", "leave_one_out" or "none".

  Args:
    kind: the baseline.
    even: median rule for even groups (only used by "median").
  """
  if kind == "mean":
    return center_by_group_mean()
  if kind == "median":
    return center_by_group_median(even=even)
  if kind == "leave_one_out":
    return center_by_leave_one_out()
  if kind == "none":
    return identity()
  raise ValueError(
      f"unknown baseline {kind!r}; expected 'mean', 'median', 'leave_one_out' or 'none'"
  )


# Scaling -----------------------------------------------------------------------------------------


def scale_by_group_std(*, ddof: int = 1, eps: float = 1e-6) -> AdvantageTransform:
  """A_i <- A_i / (std_group + eps) (GRPO; verl eps 1e-6, TRL eps 1e-4; both ddof = 1).

  The std is over valid members (shift-invariant, so it equals the rewards' std after any
  baseline). Where it is undefined (n <= ddof, e.g. a singleton with ddof = 1) the value is
  left unchanged.

  Args:
    ddof: delta degrees of freedom of the std.
    eps: added to the std.
  """

  def fn(adv, batch, key):
    v = _rows("scale_by_group_std", adv)
    std, defined = groups.group_std(v, batch.group_id, batch.valid, ddof=ddof)
    return _replace_values(adv, jnp.where(defined, v / (std + eps), v))

  return stateless(fn)


def scale_by_group_mad(*, eps: float = 1e-3, even: str = "lower") -> AdvantageTransform:
  """A_i <- A_i / (MAD_group + eps), MAD = median_j |v_j - median(v)| (MC-GRPO official code).

  With binary rewards the MAD is 0, so advantages become (r_i - m) / eps (+-1000 for the
  minority outcome at eps = 1e-3), exactly as the official code computes them.

  Args:
    eps: added to the MAD (1e-3 in the official code).
    even: median rule for even groups ("lower" as ``torch.median``, or "mean").
  """

  def fn(adv, batch, key):
    v, gid, valid = _rows("scale_by_group_mad", adv), batch.group_id, batch.valid
    med = groups.group_median(v, gid, valid, even=even)
    mad = groups.group_median(jnp.abs(v - med), gid, valid, even=even)
    return _replace_values(adv, v / (mad + eps))

  return stateless(fn)


def scale_by_batch_std(
    *, ddof: int = 1, eps: float = 1e-4, source: str = "advantages"
) -> AdvantageTransform:
  """A_i <- A_i / (std_batch + eps), one std over all valid rollouts of the batch.

  Args:
    ddof: delta degrees of freedom.
    eps: added to the std.
    source: "advantages" takes the std of the current values (REINFORCE++-style batch
      normalisation); "rewards" takes the std of the raw rewards (TRL's
      ``scale_rewards="batch"``).
  """
  if source not in ("advantages", "rewards"):
    raise ValueError(f"source must be 'advantages' or 'rewards', got {source!r}")

  def fn(adv, batch, key):
    v = _rows("scale_by_batch_std", adv)
    x = v if source == "advantages" else batch.rewards.astype(jnp.float32)
    valid = batch.valid
    n = jnp.sum(valid, dtype=jnp.float32)
    mean = jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(n, 1.0)
    ss = jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0))
    defined = n > ddof
    std = jnp.sqrt(ss / jnp.where(defined, n - ddof, 1.0))
    return _replace_values(adv, jnp.where(defined, v / (std + eps), v))

  return stateless(fn)


def group_scale(
    kind: str, *, ddof: int = 1, eps: Optional[float] = None, even: str = "lower"
) -> AdvantageTransform:
  """Dispatches a scaling by name: "std", "mad", "batch_std" or "none".

  Args:
    kind: the scaling.
    ddof: for "std" and "batch_std".
    eps: added to the scale; None takes the default of each scaling (std 1e-6, MAD 1e-3,
      batch std 1e-4).
    even: median rule for "mad".
  """
  if kind == "std":
    return scale_by_group_std(ddof=ddof, eps=1e-6 if eps is None else eps)
  if kind == "mad":
    return scale_by_group_mad(eps=1e-3 if eps is None else eps, even=even)
  if kind == "batch_std":
    return scale_by_batch_std(ddof=ddof, eps=1e-4 if eps is None else eps)
  if kind == "none":
    return identity()
  raise ValueError(f"unknown scaling {kind!r}; expected 'std', 'mad', 'batch_std' or 'none'")


# Member exclusion --------------------------------------------------------------------------------


def exclude_median_pivot(*, odd_only: bool = True) -> AdvantageTransform:
  """MC-GRPO: removes one median ("pivot") rollout per group from the loss.

  The pivot is the lowest-index valid member whose current value equals the group's (lower)
  median. Its weight and value become 0, so a group of G+1 rollouts contributes G to the loss;
  other members tied at the median stay with A = 0 and weight 1, and the pivot still counted
  in the group's baseline. The official code takes ``torch.median``'s index, which is
  arbitrary under ties; this rule is the deterministic replacement.

  Monotone transforms (centering, positive scaling) do not change which member is the pivot,
  so it can follow the baseline and the scaling; place it before sign flips.

  Args:
    odd_only: exclude a pivot only in groups with an odd number of valid members (the
      method's G+1 design); when False, even groups lose their lower-median member too.
  """

  def fn(adv, batch, key):
    v, gid, valid = _rows("exclude_median_pivot", adv), batch.group_id, batch.valid
    med = groups.group_median(v, gid, valid, even="lower")
    pivot = groups.group_first(v == med, gid, valid)
    if odd_only:
      n = groups.group_count(gid, valid)
      pivot = pivot & (jnp.mod(n, 2.0) == 1.0)
    return adv._replace(values=jnp.where(pivot, 0.0, v),
                        weights=jnp.where(pivot, 0.0, adv.weights))

  return stateless(fn)


def _drop(adv: Advantages, drop: jax.Array) -> Advantages:
  """``adv`` with the rollouts ``drop`` [B] bool removed from the loss (value and weight 0)."""
  return adv._replace(values=jnp.where(_per_row(drop, adv.values), 0.0, adv.values),
                      weights=jnp.where(drop, 0.0, adv.weights))


def exclude_min_abs_reward() -> AdvantageTransform:
  """MC-GRPO's mean-baseline ablation (``mc=False`` in its GSM trainer): with G+1 rollouts,
  drop the rollout with the smallest |reward| of each group (lowest index under ties) from
  the loss, so compute matches MC-GRPO while the baseline stays the mean over all G+1.
  """

  def fn(adv, batch, key):
    a = jnp.abs(batch.rewards.astype(jnp.float32))
    m = groups.group_min(a, batch.group_id, batch.valid)
    return _drop(adv, groups.group_first(a == m, batch.group_id, batch.valid))

  return stateless(fn)


def exclude_random_member() -> AdvantageTransform:
  """An unbiased same-compute control for MC-GRPO: with G+1 rollouts, drop one valid member of
  each group chosen uniformly at random (independent of its reward) from the loss, so that the
  G that remain are an unbiased sample while the baseline is the mean over all G+1.

  Needs a PRNG key (``compute_advantages(..., key=key)``). Unlike ``exclude_min_abs_reward``,
  whose dropped rollout under 0/1 rewards is always a failure when the group has one, the
  choice carries no information about the rewards.
  """

  def fn(adv, batch, key):
    if key is None:
      raise ValueError("exclude_random_member needs a PRNG key: compute_advantages(..., key=key)")
    u = jax.random.uniform(key, batch.group_id.shape)
    low = groups.group_min(u, batch.group_id, batch.valid)
    return _drop(adv, groups.group_first(u == low, batch.group_id, batch.valid))

  return stateless(fn)


def rescale_nonzero(*, atol: float = 1e-6) -> AdvantageTransform:
  """The official MC-GRPO GSM trainer's compensation for zero advantages: in each group, the
  non-zero values (|A| > ``atol``) are multiplied by n / n_nonzero, n the group's valid
  members (a pivot, whose value is 0, counts as a zero), so that a group whose rollouts mostly
  sit at the baseline is not down-weighted. Groups with no non-zero value are unchanged.

  Official code: lotusroot-kim/MC-GRPO, ``src/open_r1/grpo_trainer_gsm.py`` (``mc=True``, after
  the MAD scaling and before the pivot is filtered out; ``torch.isclose(a, 0, atol=1e-6)``).
  """

  def fn(adv, batch, key):
    v, gid, valid = _rows("rescale_nonzero", adv), batch.group_id, batch.valid
    nonzero = jnp.abs(v) > atol
    n = groups.group_count(gid, valid)
    k = groups.group_sum(nonzero.astype(jnp.float32), gid, valid)
    factor = jnp.where(nonzero & (k > 0), n / jnp.maximum(k, 1.0), 1.0)
    return _replace_values(adv, v * factor)

  return stateless(fn)


# ACE ---------------------------------------------------------------------------------------------


def confidence_shift(logp: jax.Array, ref_logp: jax.Array, token_mask: jax.Array) -> jax.Array:
  """ACE's confidence shift c_i = sum_t (logp_t - ref_logp_t) over valid tokens, stop-gradient.

  c_i = log pi_theta(y_i | x) / pi_ref(y_i | x), a sequence sum (not length-normalised).

  Args:
    logp: [B, T] float32 policy log-probs.
    ref_logp: [B, T] float32 reference log-probs.
    token_mask: [B, T] bool.

  Returns:
    [B] float32, carrying no gradient.
  """
  chex.assert_rank([logp, ref_logp, token_mask], 2)
  chex.assert_equal_shape([logp, ref_logp, token_mask])
  d = jnp.where(token_mask, logp - ref_logp, 0.0)
  return jax.lax.stop_gradient(jnp.sum(d, axis=-1))


def ace_modulate(
    advantages: jax.Array,
    shift: jax.Array,
    *,
    alpha: float,
    mode: str = "multiplicative",
    fn: str = "softplus",
) -> jax.Array:
  """ACE (Asymmetric Confidence-aware Error penalty): modulates negative advantages only.

      multiplicative: A_i * (1 + alpha * f(c_i))   if A_i < 0, else A_i
      additive:       A_i - alpha * f(c_i)          if A_i < 0, else A_i
  with f = softplus (the paper's choice) or relu (its ablation). ``shift`` is treated as a
  constant (stop-gradient). Token-level advantages A_{i,t} are modulated token by token with
  their rollout's c_i.

  Args:
    advantages: [B] or [B, T] float32.
    shift: [B] float32 confidence shifts c_i (see :func:`confidence_shift`).
    alpha: strength; the paper publishes no default (sweep it).
    mode: "multiplicative" or "additive".
    fn: "softplus" or "relu".

  Returns:
    float32 advantages of the shape of ``advantages``.
  """
  chex.assert_rank(advantages, {1, 2})
  chex.assert_rank(shift, 1)
  chex.assert_axis_dimension(shift, 0, advantages.shape[0])
  shift = _per_row(shift, advantages)
  if fn == "softplus":
    f = jax.nn.softplus(jax.lax.stop_gradient(shift))
  elif fn == "relu":
    f = jax.nn.relu(jax.lax.stop_gradient(shift))
  else:
    raise ValueError(f"ACE fn must be 'softplus' or 'relu', got {fn!r}")
  if mode == "multiplicative":
    mod = advantages * (1.0 + alpha * f)
  elif mode == "additive":
    mod = advantages - alpha * f
  else:
    raise ValueError(f"ACE mode must be 'multiplicative' or 'additive', got {mode!r}")
  return jnp.where(advantages < 0, mod, advantages)


def ace_confidence_penalty(
    *, alpha: float, mode: str = "multiplicative", fn: str = "softplus", logp_source: str = "old"
) -> AdvantageTransform:
  """Applies :func:`ace_modulate` with c_i from the batch's log-probs (ACE; no public code).

  Needs ``batch.ref_logp`` even when the KL coefficient is 0. Place it after the baseline and
  scaling (it modulates the final negative advantages).

  Args:
    alpha, mode, fn: see :func:`ace_modulate`.
    logp_source: which policy's log-probs give c_i: "old" (``current_logp``, else
      ``behaviour_logp``; the policy that made the batch, as advantage computation in verl),
      "current" or "behaviour".
  """
  ace_modulate(jnp.zeros((1,)), jnp.zeros((1,)), alpha=alpha, mode=mode, fn=fn)  # validates
  if logp_source not in ("old", "current", "behaviour"):
    raise ValueError(f"logp_source must be 'old', 'current' or 'behaviour', got {logp_source!r}")

  def f(adv, batch: RolloutBatch, key):
    batch.require("ref_logp")
    if logp_source == "old":
      logp = batch.old_logp
    else:
      field = f"{logp_source}_logp"
      batch.require(field)
      logp = getattr(batch, field)
    mask = batch.token_mask & batch.valid[:, None]
    c = confidence_shift(logp, batch.ref_logp, mask)
    a = ace_modulate(adv.values, c, alpha=alpha, mode=mode, fn=fn)
    out = _replace_values(adv, jnp.where(_per_row(batch.valid, a), a, 0.0))
    # What the penalty touched: rows whose advantage it changed (any token for [B, T]), their
    # share of the valid rows and the 10/50/90% quantiles of their confidence shift c_i.
    changed = a != adv.values
    hit = batch.valid & (changed if changed.ndim == 1 else jnp.any(changed, axis=1))
    q = jnp.nanquantile(jnp.where(hit, c, jnp.nan), jnp.asarray([0.1, 0.5, 0.9]))
    q = jnp.where(jnp.any(hit), q, 0.0)
    return report(out, ace_penalized=_share(hit, batch.valid), ace_shift_p10=q[0],
                  ace_shift_p50=q[1], ace_shift_p90=q[2])

  return stateless(f)


# Clipping and ablations --------------------------------------------------------------------------


def clip_advantages(*, low: float, high: float) -> AdvantageTransform:
  """A_i <- clip(A_i, low, high).

  Args:
    low: lower bound (e.g. -5.0).
    high: upper bound (e.g. 5.0); must be >= low.
  """
  if high < low:
    raise ValueError(f"clip_advantages needs low <= high, got low={low}, high={high}")
  return stateless(lambda adv, batch, key: _replace_values(adv, jnp.clip(adv.values, low, high)))


def flip_signs(*, prob: float) -> AdvantageTransform:
  """Ablation: flips the sign of each rollout's advantage independently with probability
  ``prob`` (all tokens of a rollout together when values are [B, T]).

  Needs a PRNG key (pass ``key=`` to ``compute_advantages``); MC-GRPO's ``signflip_percent``.

  Args:
    prob: flip probability in [0, 1].
  """
  if not 0.0 <= prob <= 1.0:
    raise ValueError(f"flip probability must lie in [0, 1], got {prob}")

  def fn(adv, batch, key):
    if key is None:
      raise ValueError("flip_signs needs a PRNG key: compute_advantages(..., key=key)")
    flip = _per_row(jax.random.bernoulli(key, prob, adv.values.shape[:1]), adv.values)
    return _replace_values(adv, jnp.where(flip, -adv.values, adv.values))

  return stateless(fn)
