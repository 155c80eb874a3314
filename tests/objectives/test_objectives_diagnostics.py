"""Diagnostics: hand-computed values, eager and jit."""

import functools

import jax.numpy as jnp
import numpy as np

import rlpost.objectives as O
from objectives_testutil import VARIANTS, make_batch


@VARIANTS
def test_sign_flip_rates(variant):
  rewards = np.array([1, 0, 1, 0, 0.75, 1], np.float32)
  ref = np.full(6, 0.75, np.float32)
  adv = np.array([0.5, 0.5, 0.0, -1.0, 3.0, -2.0], np.float32)
  mask = np.array([1, 1, 1, 1, 1, 0], bool)
  r = variant(O.sign_flip_rates)(adv, rewards, ref, mask)
  # Counted: rollouts 0-3 (4 has a zero reference advantage, 5 is masked out).
  np.testing.assert_allclose([r.opposite, r.zeroed, r.count], [0.25, 0.25, 4.0])


def test_fresh_group_sign_flips():
  # Two prompts x 5 rollouts in groups of 2 (the fifth left out), references 0.25 and 0.75.
  rewards = np.array([[1, 0, 0.5, 0.5, 9], [0.5, 1, 0, 0.25, 9]], np.float32)
  ref = np.array([0.25, 0.75], np.float32)
  r = O.fresh_group_sign_flips(O.get_recipe("grpo").advantage, rewards, ref, 2)
  # Group (0.5, 0.5) zeroes two advantages; in (0, 0.25) under 0.75, 0.25 gets A > 0.
  np.testing.assert_allclose([r.opposite, r.zeroed, r.count], [1 / 8, 2 / 8, 8.0])
  assert r.to_json() == {"opposite": 0.125, "zeroed": 0.25, "correct": 0.625, "count": 8}
  # The median over 3 leaves its pivot out of the loss, and so out of the count.
  med = O.fresh_group_sign_flips(O.get_recipe("mc_grpo").advantage, rewards[:, :3], ref, 3)
  assert int(med.count) == 4 and float(med.opposite) == 0.0


@VARIANTS
def test_zero_variance_fraction(variant):
  b = make_batch([[1, 1], [0, 1], [3.0], []], 2)
  f = variant(O.zero_variance_fraction)(b.rewards, b.group_id, b.valid)
  np.testing.assert_allclose(f, 2 / 3, rtol=1e-6)


@VARIANTS
def test_clip_fractions(variant):
  ratio = np.array([[1.5, 0.5, 0.5, 5.0, 2.0, 1.1]], np.float32)
  adv = np.array([1.0, -1.0], np.float32)  # [B] advantages, B = 2
  lr = np.log(np.concatenate([ratio[:, :3], ratio[:, 3:]], axis=0))  # [2, 3]
  mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
  f = variant(functools.partial(O.clip_fractions, eps_low=0.2, eps_high=0.28, dual_clip=3.0))
  c = f(lr, adv, mask)
  # Row 0 (A > 0): 1.5 clipped high. Row 1 (A < 0): 5.0 dual-clipped; no ratio < 0.8.
  np.testing.assert_allclose([c.low, c.high, c.dual], [0.0, 0.2, 0.2], rtol=1e-6)


@VARIANTS
def test_effective_sample_size(variant):
  lw = np.array([0.0, np.log(3.0), 50.0], np.float32)
  m = np.array([1, 1, 0], bool)
  e = variant(O.effective_sample_size)(lw, m)
  np.testing.assert_allclose([e.ess, e.fraction], [16 / 10, 0.8], rtol=1e-6)
  e = variant(O.effective_sample_size)(np.full((2, 3), 7.0, np.float32), np.ones((2, 3), bool))
  np.testing.assert_allclose([e.ess, e.fraction], [6.0, 1.0], rtol=1e-6)


@VARIANTS
def test_overconfident_error_fraction(variant):
  c = np.array([1.0, -1.0, 2.0, 0.5], np.float32)
  correct = np.array([0, 0, 1, 0], bool)
  valid = np.array([1, 1, 1, 0], bool)
  np.testing.assert_allclose(variant(O.overconfident_error_fraction)(c, correct, valid), 1 / 3)


@VARIANTS
def test_advantage_by_difficulty(variant):
  b = make_batch([[1, 0, 0, 0], [1, 1], [0, 0, 0]], 4, correct=[1, 0, 0, 0, 1, 1, 0, 0, 0])
  adv, _ = O.compute_advantages(O.center_by_group_mean(), b)
  f = variant(functools.partial(O.advantage_by_difficulty, num_buckets=4))
  d = f(adv.values, b.correct, b.group_id, b.valid)
  np.testing.assert_allclose(d.mean_abs_advantage, [0, 0.375, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(d.cumulative_advantage, [0, 1.5, 0, 0], rtol=1e-6)
  np.testing.assert_array_equal(d.num_groups, [1, 1, 0, 1])
  assert jnp.all(jnp.isfinite(d.mean_abs_advantage))
