"""RolloutBatch validation: shape errors, non-finite detection (jitted and eager)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.types import (
    FiniteCheck,
    RolloutBatch,
    assert_finite,
    check_finite,
    check_shapes,
    group_layout,
    raise_if_nonfinite,
)
from objectives_testutil import make_batch


def test_group_layout_row_major():
  gid, valid = group_layout([2, 3, 0], 3)
  np.testing.assert_array_equal(gid, [0, 0, 0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(valid, [1, 1, 0, 1, 1, 1, 0, 0, 0])
  with pytest.raises(ValueError, match="must lie in"):
    group_layout([4], 3)


def test_check_shapes_names_the_field():
  b = make_batch([[1.0, 0.0]], 2, seq_len=3)
  check_shapes(b)
  with pytest.raises(
      ValueError, match=r"RolloutBatch.ref_logp has shape \(2, 2\), expected \(2, 3\)"
  ):
    check_shapes(b.replace(ref_logp=jnp.zeros((2, 2))))
  with pytest.raises(ValueError, match="RolloutBatch.valid has dtype"):
    check_shapes(b.replace(valid=jnp.ones((2,), jnp.int32)))
  with pytest.raises(ValueError, match="RolloutBatch.rewards must be"):
    check_shapes(b.replace(rewards=jnp.zeros((2, 1))))


def test_check_finite_jitted_and_host_error():
  b = make_batch([[1.0, 0.0], [0.5, 0.5]], 2, seq_len=3, lengths=[3, 3, 3, 3])
  check = jax.jit(check_finite)(b)
  assert bool(check.ok) and int(check.first_bad_index) == -1
  raise_if_nonfinite(check)

  bad = b.replace(current_logp=b.current_logp.at[2, 1].set(jnp.nan))
  check = jax.jit(check_finite)(bad)
  assert not bool(check.ok)
  assert int(check.first_bad_index) == 2
  assert FiniteCheck.FIELDS[int(check.field)] == "current_logp"
  with pytest.raises(ValueError, match="current_logp of rollout 2"):
    raise_if_nonfinite(check)

  bad = b.replace(rewards=b.rewards.at[3].set(jnp.inf))
  with pytest.raises(ValueError, match="rewards of rollout 3"):
    assert_finite(bad)


def test_check_finite_ignores_padding():
  # Rollout 1 is a padded member and rollout 0 has a padded token: both may hold garbage.
  b = make_batch([[1.0]], 2, seq_len=3, lengths=[2])
  b = b.replace(
      rewards=b.rewards.at[1].set(jnp.nan),
      ref_logp=b.ref_logp.at[0, 2].set(-jnp.inf).at[1].set(jnp.nan),
  )
  assert_finite(b)


def test_assert_finite_under_jit_is_a_clear_error():
  b = make_batch([[1.0, 0.0]], 2)
  with pytest.raises(TypeError, match="check_finite"):
    jax.jit(assert_finite)(b)


def test_batch_properties():
  b = make_batch([[1.0, 0.0]], 2, seq_len=3, lengths=[1, 3])
  np.testing.assert_array_equal(b.lengths, [1, 3])
  assert b.batch_size == 2 and b.seq_len == 3
  np.testing.assert_array_equal(b.old_logp, b.current_logp)
  assert b.replace(current_logp=None).old_logp is b.behaviour_logp
  with pytest.raises(ValueError, match="neither"):
    _ = b.replace(current_logp=None, behaviour_logp=None).old_logp
  assert isinstance(b, RolloutBatch)
