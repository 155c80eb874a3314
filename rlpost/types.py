"""Pytrees shared by samplers, models, objectives and trainers: the rollout batch and loss pairs.

Shape legend
------------
P      number of prompts in the batch.
G      group size: rollouts per prompt, padded to a common maximum ``G_max``.
B      number of rollout rows, ``B = P * G_max``. Rows are laid out row-major, so rollout ``b``
       belongs to group ``b // G_max`` in the canonical layout; every function in
       ``rlpost.objectives`` reads group membership from ``group_id`` only, so other layouts
       (merged extra rollouts, shuffled rows) work as long as ids lie in ``[0, B)``.
T      completion length in tokens (padded).

Ragged groups (MC-GRPO's G+1, DARS's extra rollouts, filtered groups) are expressed with the
``valid`` mask, never by reshaping: a padded member has ``valid = False`` and must not affect any
statistic. Changing the mask never changes a shape, so nothing recompiles.

Dtypes: float32 rewards, log-probs and entropies, int32 ids and tokens, bool masks.

A loss or metric travels as ``LossParts(sum, denominator)``, a pair of float32 scalars whose
denominator does not depend on the parameters; ``rlpost.objectives.parts`` holds the arithmetic
on pairs (``finalize``, ``combine``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = [
    "RolloutBatch",
    "LossParts",
    "FiniteCheck",
    "check_shapes",
    "check_finite",
    "raise_if_nonfinite",
    "assert_finite",
    "group_layout",
    "LOGP_FIELDS",
    "TOKEN_FIELDS",
]

# The per-token log-prob fields of RolloutBatch.
LOGP_FIELDS = ("behaviour_logp", "current_logp", "ref_logp")
# Every optional per-token float32 field, in the order ``check_finite`` reports them
# (``FiniteCheck.FIELDS = ("rewards",) + TOKEN_FIELDS``); new fields are appended.
TOKEN_FIELDS = LOGP_FIELDS + ("entropy",)


@struct.dataclass
class RolloutBatch:
  """B = P x G_max rollouts with their group structure, rewards and per-token log-probs.

  Attributes:
    group_id: [B] int32, the group (prompt) of each rollout, in ``[0, B)``.
    valid: [B] bool, False for padded group members; they never enter a statistic or a loss.
    tokens: [B, T] int32 completion tokens.
    token_mask: [B, T] bool, True on real completion tokens (False on padding).
    rewards: [B] float32 scalar rewards.
    behaviour_logp: [B, T] float32 or None, log-probs under the behaviour policy, as reported
      by the sampler that produced the tokens.
    current_logp: [B, T] float32 or None, log-probs of the same tokens recomputed by the
      trainer's policy before the update epochs (PPO's ``pi_old``). When None, the sampler's
      ``behaviour_logp`` serves as ``pi_old``.
    ref_logp: [B, T] float32 or None, log-probs under the frozen reference policy (needed for
      KL terms and ACE's confidence shift).
    correct: [B] bool or None, the grader's verdict where rewards are graded.
    entropy: [B, T] float32 or None, per-token entropy H_t = -sum_v p_v log p_v of the
      sampling-time policy (the parameters that produced the batch) over the completion tokens,
      a constant for the loss. The trainer fills it when the recipe's advantage chain requires
      "entropy"; it is not the loss's differentiable ``entropy`` argument.
  """

  group_id: jax.Array
  valid: jax.Array
  tokens: jax.Array
  token_mask: jax.Array
  rewards: jax.Array
  behaviour_logp: Optional[jax.Array] = None
  current_logp: Optional[jax.Array] = None
  ref_logp: Optional[jax.Array] = None
  correct: Optional[jax.Array] = None
  entropy: Optional[jax.Array] = None

  @property
  def batch_size(self) -> int:
    """B, the number of rollout rows (static)."""
    return self.rewards.shape[0]

  @property
  def seq_len(self) -> int:
    """T, the padded completion length (static)."""
    return self.token_mask.shape[1]

  @property
  def lengths(self) -> jax.Array:
    """[B] int32 completion lengths in tokens (number of True entries of ``token_mask``)."""
    return jnp.sum(self.token_mask, axis=-1, dtype=jnp.int32)

  @property
  def old_logp(self) -> jax.Array:
    """[B, T] float32 log-probs of PPO's ``pi_old``: ``current_logp`` or ``behaviour_logp``."""
    if self.current_logp is not None:
      return self.current_logp
    if self.behaviour_logp is not None:
      return self.behaviour_logp
    raise ValueError(
        "RolloutBatch has neither current_logp nor behaviour_logp; a ratio needs one of them."
    )

  def require(self, *fields: str) -> None:
    """Raises ValueError naming every listed optional field that is None."""
    missing = [f for f in fields if getattr(self, f) is None]
    if missing:
      raise ValueError(f"RolloutBatch field(s) {missing} are None but required here.")


def _fail(msg: str) -> None:
  raise ValueError(msg)


def check_shapes(batch: RolloutBatch) -> None:
  """Checks ranks, shapes and dtypes of every field; raises ValueError naming the field.

  Runs on static shape information only, so it is free under ``jit``.
  """
  if not isinstance(batch, RolloutBatch):
    _fail(f"expected a RolloutBatch, got {type(batch).__name__}")
  if jnp.ndim(batch.rewards) != 1:
    _fail(f"RolloutBatch.rewards must be [B], got shape {jnp.shape(batch.rewards)}")
  b = batch.rewards.shape[0]
  if jnp.ndim(batch.token_mask) != 2 or batch.token_mask.shape[0] != b:
    _fail(
        f"RolloutBatch.token_mask must be [B, T] with B = {b}, "
        f"got shape {jnp.shape(batch.token_mask)}"
    )
  t = batch.token_mask.shape[1]
  specs = {
      "group_id": ((b,), "int"),
      "valid": ((b,), "bool"),
      "tokens": ((b, t), "int"),
      "token_mask": ((b, t), "bool"),
      "rewards": ((b,), "float"),
      "behaviour_logp": ((b, t), "float"),
      "current_logp": ((b, t), "float"),
      "ref_logp": ((b, t), "float"),
      "correct": ((b,), "bool"),
      "entropy": ((b, t), "float"),
  }
  for name, (shape, kind) in specs.items():
    x = getattr(batch, name)
    if x is None:
      continue
    if tuple(jnp.shape(x)) != shape:
      legend = "[B]" if len(shape) == 1 else "[B, T]"
      _fail(
          f"RolloutBatch.{name} has shape {tuple(jnp.shape(x))}, expected {shape} = {legend} "
          f"(B = {b} rollouts, T = {t} tokens)"
      )
    dtype = jnp.result_type(x)
    ok = {
        "int": jnp.issubdtype(dtype, jnp.integer),
        "bool": dtype == jnp.bool_,
        "float": jnp.issubdtype(dtype, jnp.floating),
    }[kind]
    if not ok:
      _fail(f"RolloutBatch.{name} has dtype {dtype}, expected {kind}")


class FiniteCheck(NamedTuple):
  """Result of :func:`check_finite` (all scalars, jit-friendly).

  Attributes:
    ok: [] bool, True when every checked value is finite.
    first_bad_index: [] int32, the smallest rollout index holding a non-finite value, -1 if none.
    field: [] int32, index into ``FiniteCheck.FIELDS`` of the first offending field of that
      rollout, -1 if none.
  """

  ok: jax.Array
  first_bad_index: jax.Array
  field: jax.Array

  FIELDS = ("rewards",) + TOKEN_FIELDS


def check_finite(batch: RolloutBatch) -> FiniteCheck:
  """Finds non-finite rewards, log-probs or entropies without raising (usable under ``jit``).

  Checks ``rewards`` of valid rollouts and every present per-token field (``TOKEN_FIELDS``:
  the log-probs and ``entropy``) on valid tokens (``valid[b] & token_mask[b, t]``); padding
  may hold anything.

  Returns:
    FiniteCheck(ok, first_bad_index, field); turn it into an exception on the host with
    :func:`raise_if_nonfinite`.
  """
  check_shapes(batch)
  valid = batch.valid
  per_field = [valid & ~jnp.isfinite(batch.rewards)]
  tok_valid = batch.token_mask & valid[:, None]
  for name in TOKEN_FIELDS:
    x = getattr(batch, name)
    if x is None:
      per_field.append(jnp.zeros_like(valid))
    else:
      per_field.append(jnp.any(tok_valid & ~jnp.isfinite(x), axis=-1))
  bad = jnp.stack(per_field, axis=0)  # [F, B]
  bad_row = jnp.any(bad, axis=0)
  ok = ~jnp.any(bad_row)
  first = jnp.where(ok, -1, jnp.argmax(bad_row)).astype(jnp.int32)
  field = jnp.where(ok, -1, jnp.argmax(bad[:, jnp.maximum(first, 0)])).astype(jnp.int32)
  return FiniteCheck(ok=ok, first_bad_index=first, field=field)


def raise_if_nonfinite(check: FiniteCheck) -> None:
  """Host-side: raises ValueError naming the first rollout index with a NaN/inf value."""
  if bool(np.asarray(check.ok)):
    return
  index = int(np.asarray(check.first_bad_index))
  field = FiniteCheck.FIELDS[int(np.asarray(check.field))]
  raise ValueError(f"non-finite value (NaN or inf) in RolloutBatch.{field} of rollout {index}")


def assert_finite(batch: RolloutBatch) -> None:
  """Eager check: raises ValueError naming the first rollout with a NaN/inf reward, log-prob or
  entropy.

  Under ``jit`` use :func:`check_finite` and call :func:`raise_if_nonfinite` on its result.
  """
  check = check_finite(batch)
  if isinstance(check.ok, jax.core.Tracer):
    raise TypeError(
        "assert_finite needs concrete arrays; under jit return check_finite(batch) and call "
        "raise_if_nonfinite on the host."
    )
  raise_if_nonfinite(check)


def group_layout(group_sizes: Sequence[int], group_size_max: int) -> tuple[np.ndarray, np.ndarray]:
  """Host-side helper: the canonical row-major layout for ragged groups.

  Args:
    group_sizes: P ints, the number of real rollouts of each prompt (each <= group_size_max).
    group_size_max: G_max, the padded group size.

  Returns:
    (group_id [B] int32 with ``group_id[b] = b // G_max``, valid [B] bool), B = P * G_max;
    the real rollouts of group p occupy its first ``group_sizes[p]`` slots.
  """
  sizes = np.asarray(group_sizes, dtype=np.int64)
  if np.any(sizes < 0) or np.any(sizes > group_size_max):
    raise ValueError(f"group sizes {sizes.tolist()} must lie in [0, {group_size_max}]")
  p = sizes.shape[0]
  group_id = np.repeat(np.arange(p, dtype=np.int32), group_size_max)
  slot = np.tile(np.arange(group_size_max), p)
  valid = slot < np.repeat(sizes, group_size_max)
  return group_id, valid


class LossParts(NamedTuple):
  """A loss or metric as a (sum, denominator) pair of float32 scalars.

  Parts from micro-batches, accumulation steps or data-parallel shards combine exactly by
  adding sums and denominators: ``loss = sum(sums) / sum(denominators)``. Denominators never
  depend on the parameters, so the gradient combines the same way.
  """

  sum: jax.Array
  denominator: jax.Array
