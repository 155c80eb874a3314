"""Advantage transforms: hand-computed values (eager and jit), the spec's numeric cases,
invariances (permutation, padding) and the no-recompilation guarantee."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from objectives_testutil import VARIANTS, grouped, make_batch, rows


def run(transform, batch, variant, key=None):
  fn = variant(lambda b, k: O.compute_advantages(transform, b, key=k)[0])
  adv = fn(batch, key)
  return np.asarray(adv.values), np.asarray(adv.weights)


# Baselines and scalings --------------------------------------------------------------------------


@VARIANTS
def test_grpo_mean_std_with_ragged_equal_and_singleton_groups(variant):
  b = make_batch([[1, 0, 0, 1], [1, 0], [0.1, 0.1, 0.1], [3.0]], 4)
  t = O.chain(O.center_by_group_mean(), O.scale_by_group_std(ddof=1, eps=1e-6))
  v, w = run(t, b, variant)
  a = 0.5 / (np.sqrt(1 / 3) + 1e-6)
  c = 0.5 / (np.sqrt(0.5) + 1e-6)
  np.testing.assert_allclose(
      grouped(v, 4),
      [[a, -a, -a, a], [c, -c, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
      rtol=1e-6,
  )
  # All-equal and singleton groups give exactly 0, never NaN.
  assert np.all(grouped(v, 4)[2:] == 0.0)
  np.testing.assert_array_equal(
      grouped(w, 4), [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]
  )


@VARIANTS
def test_std_ddof0_and_trl_eps(variant):
  b = make_batch([[1, 0]], 2)
  v, _ = run(O.chain(O.center_by_group_mean(), O.scale_by_group_std(ddof=0, eps=1e-4)), b, variant)
  np.testing.assert_allclose(v, [0.5 / (0.5 + 1e-4), -0.5 / (0.5 + 1e-4)], rtol=1e-6)


@VARIANTS
def test_std_undefined_leaves_value_unchanged(variant):
  # Without a baseline, a singleton keeps its raw value under std scaling (scale 1).
  b = make_batch([[3.0], [1, 0]], 2)
  v, _ = run(O.scale_by_group_std(ddof=1, eps=1e-6), b, variant)
  s = np.sqrt(0.5) + 1e-6
  np.testing.assert_allclose(v, [3.0, 0, 1 / s, 0], rtol=1e-6)


@VARIANTS
def test_median_baseline_even_rules(variant):
  b = make_batch([[1, 3, 2, 4], [5, 1, 3]], 4)
  v, _ = run(O.center_by_group_median(even="lower"), b, variant)
  np.testing.assert_allclose(grouped(v, 4), [[-1, 1, 0, 2], [2, -2, 0, 0]])
  v, _ = run(O.center_by_group_median(even="mean"), b, variant)
  np.testing.assert_allclose(grouped(v, 4), [[-1.5, 0.5, -0.5, 1.5], [2, -2, 0, 0]])


@VARIANTS
def test_leave_one_out(variant):
  b = make_batch([[1, 0, 0, 1], [2, 4, 9], [7.0], [0.3, 0.3]], 4)
  v, _ = run(O.center_by_leave_one_out(), b, variant)
  np.testing.assert_allclose(
      grouped(v, 4),
      [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [2 - 6.5, 4 - 5.5, 9 - 3, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
      rtol=1e-6,
  )


@VARIANTS
def test_batch_std_scaling(variant):
  b = make_batch([[1, 0], [4, 4]], 2)
  # source="rewards" (TRL scale_rewards="batch"): std of raw rewards [1, 0, 4, 4].
  t = O.chain(O.center_by_group_mean(), O.scale_by_batch_std(ddof=1, eps=1e-4, source="rewards"))
  v, _ = run(t, b, variant)
  s = np.std([1, 0, 4, 4], ddof=1) + 1e-4
  np.testing.assert_allclose(v, [0.5 / s, -0.5 / s, 0, 0], rtol=1e-6)
  # source="advantages": std of the centred values [.5, -.5, 0, 0].
  t = O.chain(O.center_by_group_mean(), O.scale_by_batch_std(ddof=1, eps=1e-4))
  v, _ = run(t, b, variant)
  s = np.std([0.5, -0.5, 0, 0], ddof=1) + 1e-4
  np.testing.assert_allclose(v, [0.5 / s, -0.5 / s, 0, 0], rtol=1e-6)


def test_dispatchers_reject_unknown_names():
  with pytest.raises(ValueError, match="unknown baseline 'avg'"):
    O.group_baseline("avg")
  with pytest.raises(ValueError, match="unknown scaling 'iqr'"):
    O.group_scale("iqr")
  for kind in ("mean", "median", "leave_one_out", "none"):
    O.group_baseline(kind)
  for kind in ("std", "mad", "batch_std", "none"):
    O.group_scale(kind)


# MC-GRPO: the spec's numeric cases -------------------------------------------------------------

MC = O.chain(O.center_by_group_median(), O.scale_by_group_mad(eps=1e-3), O.exclude_median_pivot())


@VARIANTS
def test_mc_grpo_binary_and_three_valued_cases(variant):
  b = make_batch([[2, 0, 0], [2, 2, 0], [2, 2, 2], [2, 1.5, 0]], 3)
  v, w = run(MC, b, variant)
  v, w = grouped(v, 3), grouped(w, 3)
  # [2,0,0] -> [2000, pivot, 0]: the median 0 is tied; the pivot is the first tied member.
  np.testing.assert_allclose(v[0], [2 / 1e-3, 0, 0], rtol=1e-5)
  np.testing.assert_array_equal(w[0], [1, 0, 1])
  # [2,2,0] -> [pivot, 0, -2000].
  np.testing.assert_allclose(v[1], [0, 0, -2 / 1e-3], rtol=1e-5)
  np.testing.assert_array_equal(w[1], [0, 1, 1])
  # [2,2,2] -> all 0, one pivot.
  np.testing.assert_array_equal(v[2], [0, 0, 0])
  np.testing.assert_array_equal(w[2], [0, 1, 1])
  # [2,1.5,0] -> m = 1.5, MAD = 0.5: [0.5/0.501 ~ 1.0, pivot, -1.5/0.501 ~ -3.0].
  np.testing.assert_allclose(v[3], [0.5 / 0.501, 0, -1.5 / 0.501], rtol=1e-6)
  np.testing.assert_array_equal(w[3], [1, 0, 1])
  # G rollouts contribute per prompt.
  np.testing.assert_array_equal(w.sum(axis=1), [2, 2, 2, 2])


@VARIANTS
def test_pivot_only_in_odd_groups_by_default(variant):
  b = make_batch([[2, 0, 0, 2], [1, 0, 0]], 4)
  v, w = run(MC, b, variant)
  np.testing.assert_array_equal(grouped(w, 4), [[1, 1, 1, 1], [1, 0, 1, 0]])
  t = O.chain(O.center_by_group_median(), O.exclude_median_pivot(odd_only=False))
  _, w = run(t, b, variant)
  # Even group: its lower median is 0, first reached at index 1.
  np.testing.assert_array_equal(grouped(w, 4), [[1, 0, 1, 1], [1, 0, 1, 0]])


@VARIANTS
def test_mc_mean_ablation_drops_min_abs_reward(variant):
  b = make_batch([[2, 0, 0], [1, -0.5, 2]], 3)
  t = O.chain(O.center_by_group_mean(), O.exclude_min_abs_reward())
  v, w = run(t, b, variant)
  np.testing.assert_array_equal(grouped(w, 3), [[1, 0, 1], [1, 0, 1]])
  np.testing.assert_allclose(
      grouped(v, 3), [[4 / 3, 0, -2 / 3], [1 - 2.5 / 3, 0, 2 - 2.5 / 3]], rtol=1e-6
  )


@VARIANTS
def test_mc_official_rescale_of_nonzero_advantages(variant):
  """GSM trainer (mc=True): non-zero advantages x (G+1) / n_nonzero per group, the pivot
  counting as a zero, then the pivot is dropped."""
  b = make_batch([[2, 1.5, 0], [2, 0, 0], [2, 2, 2]], 3)
  v, w = run(O.get_recipe("mc_grpo", rescale=True).advantage, b, variant)
  mad = 0.5 + 1e-3
  np.testing.assert_allclose(grouped(v, 3), [[1.5 * 0.5 / mad, 0, -1.5 * 1.5 / mad],
                                             [3 * 2 / 1e-3, 0, 0], [0, 0, 0]], rtol=1e-5)
  np.testing.assert_array_equal(grouped(w, 3), [[1, 0, 1], [1, 0, 1], [0, 1, 1]])
  plain, _ = run(O.get_recipe("mc_grpo").advantage, b, variant)
  np.testing.assert_allclose(grouped(plain, 3)[1], [2 / 1e-3, 0, 0], rtol=1e-5)
  # the transform alone: a group with no non-zero value is unchanged, atol as torch.isclose
  t = O.rescale_nonzero()
  v, _ = run(t, make_batch([[0.0, 5e-7, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], 4), variant)
  np.testing.assert_allclose(grouped(v, 4), [[0, 5e-7, 0, 4.0], [0, 0, 0, 0]], rtol=1e-6)


@VARIANTS
def test_mc_random_drop_control_is_uniform_and_reward_blind(variant):
  """mean over G+1 with one uniformly random member dropped: exactly one per group, the
  baseline over all G+1, and over many keys each position is dropped about equally often
  (the min-|r| ablation would always drop the failure of [1, 1, 0])."""
  b = make_batch([[1, 1, 0], [1, -0.5, 2]], 3)
  rec = O.get_recipe("mc_grpo", baseline="mean_random", scale="none")
  keys = jax.random.split(jax.random.key(0), 600)
  adv = variant(jax.vmap(lambda k: O.compute_advantages(rec.advantage, b, key=k)[0]))(keys)
  w = np.asarray(adv.weights).reshape(600, 2, 3)
  v = np.asarray(adv.values).reshape(600, 2, 3)
  assert (w.sum(-1) == 2).all()
  want = np.array([[1, 1, 0], [1, -0.5, 2]]) - np.array([[2 / 3], [2.5 / 3]])
  np.testing.assert_allclose(np.where(w == 1, v, 0), np.where(w == 1, want, 0), rtol=1e-6,
                             atol=1e-7)
  dropped = (1 - w).mean(0)  # each position ~1/3 (binomial SD 0.019 at 600 draws)
  assert np.all(np.abs(dropped - 1 / 3) < 0.08), dropped
  with pytest.raises(ValueError, match="needs a PRNG key"):
    run(rec.advantage, b, variant)
  with pytest.raises(ValueError, match="baseline must be 'median', 'mean' or 'mean_random'"):
    O.get_recipe("mc_grpo", baseline="mode")


@VARIANTS
def test_mc_std_scale_option(variant):
  b = make_batch([[2, 1.5, 0]], 3)
  rec = O.get_recipe("mc_grpo", scale="std")
  v, w = run(rec.advantage, b, variant)
  s = np.std([2, 1.5, 0], ddof=1) + 1e-4
  np.testing.assert_allclose(v, [0.5 / s, 0, -1.5 / s], rtol=1e-6)
  np.testing.assert_array_equal(w, [1, 0, 1])


# Reward shaping, ACE, clipping, sign flips -------------------------------------------------------


@VARIANTS
def test_overlong_shaping_in_tokens(variant):
  b = make_batch([[1, 1, 1, 1, 1]], 5, seq_len=12, lengths=[5, 6, 8, 10, 12])
  v, _ = run(O.overlong_shaping(max_length=10, buffer_length=4), b, variant)
  np.testing.assert_allclose(v, 1 + np.array([0, 0, -0.5, -1, -1]), rtol=1e-6)
  v, _ = run(O.overlong_shaping(max_length=10, buffer_length=4, penalty_factor=0.5), b, variant)
  np.testing.assert_allclose(v, 1 + 0.5 * np.array([0, 0, -0.5, -1, -1]), rtol=1e-6)
  with pytest.raises(ValueError, match="buffer_length"):
    O.overlong_shaping(max_length=4, buffer_length=8)


def _softplus(x):
  return np.log1p(np.exp(x))


@VARIANTS
@pytest.mark.parametrize(
    "mode,fn,expect",
    [
        ("multiplicative", "softplus", lambda a, c: a * (1 + 0.5 * _softplus(c))),
        ("additive", "softplus", lambda a, c: a - 0.5 * _softplus(c)),
        ("multiplicative", "relu", lambda a, c: a * (1 + 0.5 * np.maximum(c, 0))),
        ("additive", "relu", lambda a, c: a - 0.5 * np.maximum(c, 0)),
    ],
)
def test_ace_modulate(variant, mode, fn, expect):
  a = np.array([-1.0, 1.0, -2.0, 0.0], np.float32)
  c = np.array([0.5, 2.0, -1.0, 3.0], np.float32)
  out = variant(functools.partial(O.ace_modulate, alpha=0.5, mode=mode, fn=fn))(a, c)
  want = np.where(a < 0, expect(a, c), a)
  np.testing.assert_allclose(out, want, rtol=1e-6)


@VARIANTS
def test_ace_transform_uses_sequence_sum_of_valid_tokens(variant):
  b = make_batch([[1, 0, 0]], 3, seq_len=3, lengths=[3, 2, 1])
  t = O.chain(O.center_by_group_mean(), O.ace_confidence_penalty(alpha=1.0))
  v, _ = run(t, b, variant)
  m = np.asarray(b.token_mask)
  c = np.sum(np.where(m, np.asarray(b.current_logp) - np.asarray(b.ref_logp), 0), axis=1)
  base = np.array([2 / 3, -1 / 3, -1 / 3])
  np.testing.assert_allclose(v, np.where(base < 0, base * (1 + _softplus(c)), base), rtol=1e-5)
  with pytest.raises(ValueError, match="ref_logp"):
    run(t, b.replace(ref_logp=None), variant)


def test_ace_gradient_is_the_softplus_weighted_form():
  """With c_i stop-gradient, d loss / d logp = -A_i (1 + alpha softplus(c_i)) / (n_i * N)
  at ratio 1 (on-policy), for A_i < 0; unchanged for A_i >= 0."""
  b = make_batch([[1, 0, 0, 1], [1, 0, 0, 0]], 4, seq_len=3, lengths=[3, 2, 1, 3, 2, 3, 1, 2])
  b = b.replace(current_logp=b.behaviour_logp)
  alpha = 0.7
  rec = O.get_recipe("ace", alpha=alpha, kl_coef=0.0)

  def loss(logp):
    batch = b.replace(current_logp=logp)
    adv, _ = O.compute_advantages(rec.advantage, batch)
    parts, _ = rec.loss_fn(logp, batch, adv.values, adv.weights)
    return O.finalize(parts)

  g = jax.jit(jax.grad(loss))(b.current_logp)
  base, _ = O.compute_advantages(O.get_recipe("grpo").advantage, b)
  m = np.asarray(b.token_mask)
  c = np.sum(np.where(m, np.asarray(b.current_logp - b.ref_logp), 0), axis=1)
  a = np.asarray(base.values)
  mod = np.where(a < 0, a * (1 + alpha * _softplus(c)), a)
  n = m.sum(1)
  want = np.where(m, -mod[:, None] / (n[:, None] * 8), 0)
  np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)
  # The shift itself carries no gradient.
  gc = jax.grad(
      lambda lp: O.ace_modulate(
          jnp.asarray(a), O.confidence_shift(lp, b.ref_logp, b.token_mask), alpha=alpha
      ).sum()
  )(b.current_logp)
  np.testing.assert_array_equal(gc, 0.0)


@VARIANTS
def test_clip_advantages(variant):
  b = make_batch([[-7, 0.5, 9]], 3)
  v, _ = run(O.clip_advantages(low=-5.0, high=5.0), b, variant)
  np.testing.assert_allclose(v, [-5, 0.5, 5])
  with pytest.raises(ValueError):
    O.clip_advantages(low=1.0, high=0.0)


@VARIANTS
def test_flip_signs_needs_a_key_and_is_deterministic(variant):
  b = make_batch([[1, -2, 3, -4]], 4)
  key = jax.random.PRNGKey(0)
  v1, _ = run(O.flip_signs(prob=1.0), b, variant, key)
  np.testing.assert_allclose(v1, [-1, 2, -3, 4])
  v0, _ = run(O.flip_signs(prob=0.0), b, variant, key)
  np.testing.assert_allclose(v0, [1, -2, 3, -4])
  va, _ = run(O.chain(O.identity(), O.flip_signs(prob=0.5)), b, variant, key)
  vb, _ = run(O.chain(O.identity(), O.flip_signs(prob=0.5)), b, variant, key)
  np.testing.assert_array_equal(va, vb)
  np.testing.assert_allclose(np.abs(va), [1, 2, 3, 4])
  with pytest.raises(ValueError, match="PRNG key"):
    run(O.flip_signs(prob=0.5), b, variant, None)


# Invariances -------------------------------------------------------------------------------------

CHAINS = {
    "grpo": O.get_recipe("grpo").advantage,
    "rloo": O.get_recipe("rloo").advantage,
    "mc_grpo": O.get_recipe("mc_grpo").advantage,
    "dapo": O.get_recipe("dapo", max_length=6, overlong_buffer=3).advantage,
    "median_even_mean": O.chain(O.center_by_group_median(even="mean"), O.scale_by_group_mad()),
}


def _random_groups(rng, sizes):
  # Distinct rewards so that the MC pivot is unique and order-independent.
  vals = rng.permutation(np.arange(sum(sizes)) * 0.25)
  out, i = [], 0
  for s in sizes:
    out.append(vals[i : i + s].tolist())
    i += s
  return out


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_permuting_rows_permutes_advantages(name):
  rng = np.random.default_rng(1)
  b = make_batch(_random_groups(rng, [3, 5, 1, 4]), 5, seq_len=6, seed=2)
  perm = rng.permutation(b.batch_size)
  f = jax.jit(lambda batch: O.compute_advantages(CHAINS[name], batch)[0])
  adv, adv_p = f(b), f(rows(b, perm))
  np.testing.assert_allclose(np.asarray(adv.values)[perm], adv_p.values, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(adv.weights)[perm], adv_p.weights)


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_padded_members_change_nothing(name):
  rng = np.random.default_rng(3)
  groups = _random_groups(rng, [3, 5, 1, 4])
  lengths = rng.integers(1, 7, size=13).tolist()
  small = make_batch(groups, 5, seq_len=6, lengths=lengths, seed=4, pad_reward=-50.0)
  big = make_batch(groups, 8, seq_len=6, lengths=lengths, seed=5, pad_reward=float("nan"))
  # Same real rollouts, same log-probs on them.
  for field in ("behaviour_logp", "current_logp", "ref_logp"):
    src = getattr(small, field)
    dst = np.asarray(getattr(big, field)).copy()
    dst[np.asarray(big.valid)] = np.asarray(src)[np.asarray(small.valid)]
    big = big.replace(**{field: jnp.asarray(dst)})
  f = jax.jit(lambda batch: O.compute_advantages(CHAINS[name], batch)[0])
  a_small, a_big = f(small), f(big)
  np.testing.assert_allclose(
      np.asarray(a_small.values)[np.asarray(small.valid)],
      np.asarray(a_big.values)[np.asarray(big.valid)],
      rtol=1e-6,
      atol=1e-6,
  )
  np.testing.assert_array_equal(
      np.asarray(a_small.weights)[np.asarray(small.valid)],
      np.asarray(a_big.weights)[np.asarray(big.valid)],
  )
  assert np.all(np.asarray(a_big.values)[~np.asarray(big.valid)] == 0)
  assert np.all(np.asarray(a_big.weights)[~np.asarray(big.valid)] == 0)


def test_changing_group_sizes_through_the_mask_does_not_recompile():
  traces = []

  @jax.jit
  def step(batch):
    traces.append(None)
    adv, _ = O.compute_advantages(CHAINS["mc_grpo"], batch)
    return adv

  b = make_batch([[1, 0, 0], [2, 2, 0]], 4, seq_len=3)
  step(b)
  for valid in ([1, 1, 0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1]):
    out = step(b.replace(valid=jnp.asarray(valid, bool)))
    assert np.all(np.isfinite(out.values))
  assert len(traces) == 1
  assert step._cache_size() == 1


def test_changing_masks_and_weights_does_not_recompile_the_loss():
  recipe = O.get_recipe("mc_grpo")
  traces = []

  @jax.jit
  def loss(logp, batch):
    traces.append(None)
    adv, _ = O.compute_advantages(recipe.advantage, batch)
    return O.finalize(recipe.loss_fn(logp, batch, adv.values, adv.weights)[0])

  b = make_batch([[1, 0, 0], [2, 2, 0]], 4, seq_len=3)
  for valid in ([1, 1, 1, 0, 1, 1, 1, 0], [1, 1, 0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0, 0]):
    bb = b.replace(valid=jnp.asarray(valid, bool), token_mask=~b.token_mask)
    assert np.isfinite(loss(bb.current_logp, bb))
  assert len(traces) == 1 and loss._cache_size() == 1


def test_chain_state_and_init():
  t = O.chain(O.center_by_group_mean(), O.identity())
  s = t.init()
  assert isinstance(s, O.ChainState) and len(s.inner) == 2
  b = make_batch([[1, 0]], 2)
  adv, s2 = O.compute_advantages(t, b, s)
  assert isinstance(adv, O.Advantages)
  assert jax.tree.structure(s) == jax.tree.structure(s2)
