"""Rollout allocation rules with a fake sampler: shapes, group ids, validity, consumption."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.rollouts import allocate


def fake_sampler(correct_of):
  """sample(idx, key): row r is correct iff ``correct_of(idx[r], r)``; no model involved."""

  def sample(idx, key):
    del key
    r = idx.shape[0]
    ok = correct_of(idx, jnp.arange(r))
    out = dict(tokens=jnp.zeros((r, 3), jnp.int32), num_steps=jnp.int32(3))
    return allocate.Rollouts(idx, jnp.zeros((r, 2), jnp.int32), jnp.ones((r, 2), bool), out,
                             ok.astype(jnp.float32), ok)

  return sample


def stream(n):
  return lambda k: jnp.arange(k, dtype=jnp.int32) % n


@pytest.mark.parametrize("jit", [False, True])
def test_plain(jit):
  run = lambda key: allocate.plain(fake_sampler(lambda i, r: i % 2 == 0), stream(10), key,  # noqa
                                   num_prompts=3, group_size=2)
  a = (jax.jit(run) if jit else run)(jax.random.key(0))
  assert a.consumed == 3 and a.metrics == {}
  np.testing.assert_array_equal(a.group_id, [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(a.rollouts.idx, [0, 0, 1, 1, 2, 2])
  assert bool(jnp.all(a.valid))


@pytest.mark.parametrize("jit", [False, True])
def test_dynamic_sampling_keeps_mixed_groups_first(jit):
  # 6 groups of 2 sampled for P = 3: prompt 1 and 4 mixed (row parity), the rest all wrong.
  def correct(i, r):
    return ((i == 1) | (i == 4)) & (r % 2 == 0)

  run = lambda key: allocate.dynamic_sampling(fake_sampler(correct), stream(10), key,  # noqa
                                              num_prompts=3, group_size=2, factor=2)
  a = (jax.jit(run) if jit else run)(jax.random.key(0))
  assert a.consumed == 6
  # Mixed groups (prompts 1, 4) first in sampling order, then the first unmixed one, invalid.
  np.testing.assert_array_equal(a.rollouts.idx, [1, 1, 4, 4, 0, 0])
  np.testing.assert_array_equal(a.valid, [True, True, True, True, False, False])
  np.testing.assert_array_equal(a.group_id, [0, 0, 1, 1, 2, 2])
  np.testing.assert_allclose(a.metrics["kept_groups"], 2 / 3)
  np.testing.assert_allclose(a.metrics["mixed_fraction_sampled"], 2 / 6)
  assert a.rollouts.sample["tokens"].shape == (6, 3)


def test_dars_assigns_the_budget_by_schedule_and_drops_unmixed_groups():
  # P = 2 prompts, G = 4, n_max = 8. Prompt 0: stage 1 all wrong, stage 2 right on even rows;
  # prompt 1: stage 1 all right. ET gives prompt 0 its schedule's extra rollouts (a = 0 ->
  # a_eff = 1/8: ceil((2 - 4 * 2 * 1/8 * 7/8) / (2 * 1/8 * 7/8)) = 6 > n_max - G = 4 -> 4),
  # prompt 1 none (a >= 0.5).
  calls = []

  def correct(i, r):
    calls.append(i.shape[0])
    stage2 = i.shape[0] == 6
    return jnp.where(stage2, (i == 0) & (r % 2 == 0), i == 1)

  a = allocate.dars(fake_sampler(correct), stream(10), jax.random.key(0), num_prompts=2,
                    group_size=4, n_max=8, schedule="et", budget=6)
  assert calls == [8, 6] and a.consumed == 2
  np.testing.assert_array_equal(a.group_id, [0] * 4 + [1] * 4 + [0] * 4 + [1] * 2)
  # Prompt 0's merged group (4 wrong + 4 stage-2, 2 right) is mixed; prompt 1's is all right,
  # and stage-2 rows beyond the schedule's need (the last 2) are invalid.
  np.testing.assert_array_equal(a.valid, [True] * 4 + [False] * 4 + [True] * 4 + [False] * 2)
  m = {k: float(v) for k, v in a.metrics.items()}
  want = dict(dars_demand=4.0, dars_truncated=0.0, dars_extra_rollouts=4.0,
              dars_budget_used=4 / 6, dars_all_wrong_stage1=1.0, dars_rescued=1.0,
              kept_groups=0.5)
  assert m.keys() == want.keys()
  np.testing.assert_allclose([m[k] for k in want], list(want.values()), rtol=1e-6)
