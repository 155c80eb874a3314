"""Helpers shared by the objective tests: tiny ragged batches and the eager/jit variants."""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.types import RolloutBatch, group_layout

# Every hand-computed case runs both eagerly and under jit.
VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def make_batch(
    rewards_by_group: Sequence[Sequence[float]],
    group_size: int,
    *,
    seq_len: int = 4,
    lengths: Optional[Sequence[int]] = None,
    seed: int = 0,
    logps: bool = True,
    correct: Optional[Sequence[bool]] = None,
    pad_reward: float = 123.0,
) -> RolloutBatch:
  """A RolloutBatch with groups padded to ``group_size``.

  Padded members get reward ``pad_reward`` (never used by a correct implementation), random
  tokens and random log-probs. ``lengths`` lists the completion length of each real rollout
  in group order (default: random in [1, seq_len]).
  """
  rng = np.random.default_rng(seed)
  sizes = [len(g) for g in rewards_by_group]
  gid, valid = group_layout(sizes, group_size)
  b = gid.shape[0]
  rewards = np.full((b,), pad_reward, np.float32)
  lens = np.zeros((b,), np.int64)
  real = np.flatnonzero(valid)
  flat_r = [r for g in rewards_by_group for r in g]
  rewards[real] = flat_r
  if lengths is None:
    lens[real] = rng.integers(1, seq_len + 1, size=len(real))
  else:
    lens[real] = lengths
  lens[~valid] = rng.integers(0, seq_len + 1, size=int((~valid).sum()))
  token_mask = np.arange(seq_len)[None, :] < lens[:, None]
  fields = {}
  if logps:
    for name in ("behaviour_logp", "current_logp", "ref_logp"):
      fields[name] = jnp.asarray(-rng.uniform(0.1, 2.0, size=(b, seq_len)).astype(np.float32))
  corr = None
  if correct is not None:
    corr = np.zeros((b,), bool)
    corr[real] = correct
    corr = jnp.asarray(corr)
  return RolloutBatch(
      group_id=jnp.asarray(gid, jnp.int32),
      valid=jnp.asarray(valid),
      tokens=jnp.asarray(rng.integers(0, 50, size=(b, seq_len)), jnp.int32),
      token_mask=jnp.asarray(token_mask),
      rewards=jnp.asarray(rewards),
      correct=corr,
      **fields,
  )


def rows(batch: RolloutBatch, idx) -> RolloutBatch:
  """The rows ``idx`` of every field (a micro-batch or a permutation)."""
  idx = np.asarray(idx)
  return jax.tree.map(lambda x: x[idx], batch)


def grouped(values, group_size: int) -> np.ndarray:
  """[B] -> [P, G_max] numpy, for readable assertions."""
  return np.asarray(values).reshape(-1, group_size)
