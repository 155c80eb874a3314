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
  want = dict(dars_demand=4.0, dars_truncated=0.0, dars_truncated_fraction=0.0,
              dars_extra_rollouts=4.0, dars_budget_used=4 / 6, dars_stage2_calls=1.0,
              dars_all_wrong_stage1=1.0, dars_rescued=1.0, kept_groups=0.5)
  assert m.keys() == want.keys()
  np.testing.assert_allclose([m[k] for k in want], list(want.values()), rtol=1e-6)


def marked_sampler(correct_of):
  """``fake_sampler`` whose rows carry token 1: rows of a call that did not run stay 0."""
  inner = fake_sampler(correct_of)

  def sample(idx, key):
    ro = inner(idx, key)
    return ro._replace(sample=dict(ro.sample, tokens=jnp.ones_like(ro.sample["tokens"])))

  return sample


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_dars_runs_the_calls_its_demand_needs(jit):
  # P = 4, G = 4, n_max = 8, ET: prompts 0 and 2 all wrong in stage 1 (4 extra rows each, the
  # cap n_max - G), 1 and 3 all right (none): demand 8 of at most P (n_max - G) = 16 rows, so
  # chunk 4 runs 2 of the 4 stage-2 calls. A static budget of P G = 16 rows would hold it too;
  # the unchunked rule with that budget gives the same groups and validity.
  def run(chunk, key):
    traced = []

    def correct(i, r):  # the first call traced is stage 1
      stage1 = not traced
      traced.append(i.shape[0])
      return i % 2 == 1 if stage1 else (i == 0) & (r % 2 == 0)

    return allocate.dars(marked_sampler(correct), stream(10), key, num_prompts=4, group_size=4,
                         n_max=8, schedule="et", budget=16, chunk=chunk)

  a = (jax.jit(run, static_argnums=0) if jit else run)(4, jax.random.key(0))
  static = run(0, jax.random.key(0))
  m = {k: float(v) for k, v in a.metrics.items()}
  assert (m["dars_demand"], m["dars_stage2_calls"], m["dars_truncated"]) == (8.0, 2.0, 0.0)
  assert m["dars_truncated_fraction"] == 0 and m["dars_budget_used"] == 0.5
  ran = np.asarray(a.rollouts.sample["tokens"][:, 0]) == 1
  np.testing.assert_array_equal(ran, [True] * 24 + [False] * 8)  # stage 1, 2 calls, 2 not run
  np.testing.assert_array_equal(a.live, [True] * 24 + [False] * 8)
  np.testing.assert_array_equal(a.group_id, static.group_id)
  np.testing.assert_array_equal(a.valid, static.valid)
  # Prompt 0's merged group is mixed (stage-2 rows 16 and 18 right); the rest are unmixed.
  np.testing.assert_array_equal(a.valid, [True] * 4 + [False] * 12 + [True] * 4 + [False] * 12)
  assert static.live is None and m["dars_rescued"] == 1


def test_chunked_dars_plan_and_arguments():
  rule = allocate.get_allocation("dars")
  args = rule.parse({"n_max": 8, "chunk": 12})  # P (n_max - G) = 16 rows: 2 calls of 12
  assert rule.plan(args, 4, 4) == allocate.Plan((16, 12, 12), 40)
  with pytest.raises(ValueError, match="budget must be 0 with chunk"):
    rule.parse({"chunk": 4, "budget": 8})
  with pytest.raises(ValueError, match="chunk must be >= 0"):
    rule.parse({"chunk": -1})
