"""Masked group statistics as segment reductions.

Shape legend: B rollouts, each with a group id in ``[0, B)`` and a validity mask. Every function
returns per-rollout values [B] (the group statistic gathered back to each member), uses
``num_segments = B`` (static), and ignores members with ``mask = False`` entirely: adding,
removing or changing an invalid member changes no statistic, and changing the mask never
changes a shape. Statistics of a group without valid members are 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import chex

__all__ = [
    "group_count",
    "group_sum",
    "group_mean",
    "group_min",
    "group_max",
    "group_all_equal",
    "group_std",
    "group_median",
    "group_first",
]


def _check(values: jax.Array, group_id: jax.Array, mask: jax.Array) -> None:
  chex.assert_rank([values, group_id, mask], 1)
  chex.assert_equal_shape([values, group_id, mask])


def _per_group(x: jax.Array, group_id: jax.Array) -> jax.Array:
  return x[group_id]


def group_count(group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] float32 number of valid members in each rollout's group.

  Args:
    group_id: [B] int32 group ids.
    mask: [B] bool validity.
  """
  chex.assert_rank([group_id, mask], 1)
  n = group_id.shape[0]
  counts = jax.ops.segment_sum(mask.astype(jnp.float32), group_id, num_segments=n)
  return _per_group(counts, group_id)


def group_sum(values: jax.Array, group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] float32 sum of ``values`` [B] over the valid members of each rollout's group."""
  _check(values, group_id, mask)
  n = values.shape[0]
  sums = jax.ops.segment_sum(jnp.where(mask, values, 0.0), group_id, num_segments=n)
  return _per_group(sums, group_id)


def group_max(values: jax.Array, group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] float32 maximum of ``values`` over valid group members (0 for empty groups)."""
  _check(values, group_id, mask)
  n = values.shape[0]
  m = jax.ops.segment_max(jnp.where(mask, values, -jnp.inf), group_id, num_segments=n)
  m = _per_group(m, group_id)
  return jnp.where(jnp.isfinite(m), m, 0.0)


def group_min(values: jax.Array, group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] float32 minimum of ``values`` over valid group members (0 for empty groups)."""
  _check(values, group_id, mask)
  n = values.shape[0]
  m = jax.ops.segment_min(jnp.where(mask, values, jnp.inf), group_id, num_segments=n)
  m = _per_group(m, group_id)
  return jnp.where(jnp.isfinite(m), m, 0.0)


def group_all_equal(values: jax.Array, group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] bool, True where every valid member of the rollout's group has the same value.

  Groups of size 1 count as all-equal.
  """
  return group_max(values, group_id, mask) == group_min(values, group_id, mask)


def group_mean(values: jax.Array, group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] float32 mean of ``values`` over valid group members.

  All-equal groups return their common value exactly (no rounding), so ``values - mean`` is
  exactly 0 there.
  """
  s = group_sum(values, group_id, mask)
  n = group_count(group_id, mask)
  mean = s / jnp.maximum(n, 1.0)
  return jnp.where(group_all_equal(values, group_id, mask), group_max(values, group_id, mask), mean)


def group_std(
    values: jax.Array, group_id: jax.Array, mask: jax.Array, *, ddof: int = 1
) -> tuple[jax.Array, jax.Array]:
  """Standard deviation over valid group members.

  std = sqrt(sum_i (v_i - mean)^2 / (n - ddof)).

  Args:
    values: [B] float32.
    group_id: [B] int32.
    mask: [B] bool.
    ddof: delta degrees of freedom (1 = unbiased, as ``torch.std``; 0 = population).

  Returns:
    (std [B] float32, defined [B] bool): ``defined`` is False where ``n <= ddof`` (e.g. a
    group of size 1 with ddof = 1); ``std`` is 0 there.
  """
  mean = group_mean(values, group_id, mask)
  dev2 = jnp.where(mask, jnp.square(values - mean), 0.0)
  ss = group_sum(dev2, group_id, mask)
  n = group_count(group_id, mask)
  defined = n > ddof
  var = ss / jnp.where(defined, n - ddof, 1.0)
  return jnp.where(defined, jnp.sqrt(var), 0.0), defined


def group_median(
    values: jax.Array, group_id: jax.Array, mask: jax.Array, *, even: str = "lower"
) -> jax.Array:
  """[B] float32 median of ``values`` over valid group members.

  Computed by one stable lexicographic sort on (group id, invalid-last, value), then reading
  the middle rank of each group; no Python control flow, one compilation for every mask.

  Args:
    values: [B] float32.
    group_id: [B] int32.
    mask: [B] bool.
    even: rule for groups with an even number of valid members: "lower" takes the lower of
      the two middle values (``torch.median``'s rule, used by the MC-GRPO code), "mean"
      averages them (``numpy.median``'s rule). Odd groups have a unique median either way.
  """
  _check(values, group_id, mask)
  if even not in ("lower", "mean"):
    raise ValueError(f"even must be 'lower' or 'mean', got {even!r}")
  n_rows = values.shape[0]
  filled = jnp.where(mask, values, 0.0)
  order = jnp.lexsort((filled, ~mask, group_id))
  sorted_vals = filled[order]
  ones = jnp.ones_like(values, dtype=jnp.int32)
  total = jax.ops.segment_sum(ones, group_id, num_segments=n_rows)
  starts = jnp.cumsum(total) - total
  n_valid = jax.ops.segment_sum(mask.astype(jnp.int32), group_id, num_segments=n_rows)
  lo = jnp.clip(starts + jnp.maximum(n_valid - 1, 0) // 2, 0, n_rows - 1)
  hi = jnp.clip(starts + n_valid // 2, 0, n_rows - 1)
  med_lo = sorted_vals[lo]
  if even == "lower":
    med = med_lo
  else:
    med = jnp.where(n_valid % 2 == 1, med_lo, 0.5 * (med_lo + sorted_vals[hi]))
  med = jnp.where(n_valid > 0, med, 0.0)
  return _per_group(med, group_id)


def group_first(cond: jax.Array, group_id: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] bool, True only on the lowest-index valid member of each group where ``cond`` holds.

  This is the deterministic tie-break used for pivots: among tied candidates the one that
  comes first in the batch is chosen.

  Args:
    cond: [B] bool candidates.
    group_id: [B] int32.
    mask: [B] bool validity.
  """
  chex.assert_rank([cond, group_id, mask], 1)
  n = cond.shape[0]
  idx = jnp.arange(n, dtype=jnp.int32)
  cand = cond & mask
  first = jax.ops.segment_min(jnp.where(cand, idx, n), group_id, num_segments=n)
  return cand & (idx == first[group_id])
