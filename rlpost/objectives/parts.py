"""Loss pairs: ``LossParts(sum, denominator)`` and the arithmetic on them.

The bottom module of ``rlpost.objectives``: it imports nothing from the package, so every other
module (ratios, losses, base, advantages, diagnostics, recipes) may import it. ``LossParts``
itself is defined in ``rlpost.types`` (below models and objectives, so ``rlpost.models.packing``
reports its metrics as pairs too) and re-exported here.

A loss or metric travels as a pair of float32 scalars whose denominator does not depend on the
parameters. Pairs from disjoint row sets (micro-batches, accumulation steps, data-parallel
shards) add up exactly:

    finalize(combine([p_1, ..., p_n])) = (sum_k p_k.sum) / (sum_k p_k.denominator)
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from rlpost.types import LossParts

__all__ = ["LossParts", "safe_divide", "finalize", "combine", "finalize_metrics"]


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
