"""Token-level advantages [B, T] end to end, and ``RolloutBatch.entropy`` read by a chain
(eager and jitted)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from rlpost.types import LOGP_FIELDS, TOKEN_FIELDS, FiniteCheck, RolloutBatch
from objectives_testutil import VARIANTS, make_batch


def spread_over_tokens(*, gamma):
  """Toy token-level transform: A_{i,t} = A_i gamma^t ([B] -> [B, T])."""

  def fn(adv, batch, key):
    disc = gamma ** jnp.arange(batch.seq_len, dtype=jnp.float32)
    return adv._replace(values=adv.values[:, None] * disc)

  return O.stateless(fn)


def _batch():
  # Groups [1, 0] and [3, 1] padded to 3; lengths 3, 1 | 2, 3.
  return make_batch([[1, 0], [3, 1]], 3, seq_len=3, lengths=[3, 1, 2, 3])


# A = r - group mean: [.5, -.5, pad | 1, -1, pad], spread with gamma = 1/2, 0 off the mask.
WANT = np.array(
    [
        [0.5, 0.25, 0.125],
        [-0.5, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [1.0, 0.5, 0.0],
        [-1.0, -0.5, -0.25],
        [0.0, 0.0, 0.0],
    ]
)


@VARIANTS
def test_token_level_chain_through_compute_advantages(variant):
  b = _batch()
  chain = O.chain(O.center_by_group_mean(), spread_over_tokens(gamma=0.5))
  adv, _ = variant(lambda b: O.compute_advantages(chain, b))(b)
  assert adv.values.shape == (6, 3) and adv.weights.shape == (6,)
  np.testing.assert_allclose(adv.values, WANT, rtol=1e-6)
  np.testing.assert_array_equal(adv.weights, [1, 1, 0, 1, 1, 0])
  # Not vacuous: the raw chain puts nonzero values on masked tokens and padded rows.
  raw, _ = chain.update(O.init_advantages(b), chain.init(), b, None)
  assert raw.values[1, 1] != 0 and np.any(np.asarray(raw.values[2]) != 0)


@VARIANTS
def test_token_level_advantages_in_policy_loss(variant):
  """On policy (ratio 1), token_mean: loss = -sum_{b,t} w_b m_bt A_bt / sum_b w_b n_b and
  d loss / d logp_bt = -A_bt / sum_b w_b n_b."""
  b = _batch()
  chain = O.chain(O.center_by_group_mean(), spread_over_tokens(gamma=0.5))
  cfg = O.PolicyLossConfig(aggregation="token_mean")

  def run(b, logp):
    adv, _ = O.compute_advantages(chain, b)

    def f(lp):
      parts, metrics = O.policy_loss(lp, b, adv.values, adv.weights, config=cfg)
      return O.finalize(parts), (parts, metrics)

    return jax.grad(f, has_aux=True)(logp)

  grad, (parts, metrics) = variant(run)(b, b.current_logp)
  np.testing.assert_allclose([parts.sum, parts.denominator], [-WANT.sum(), 9.0], rtol=1e-6)
  np.testing.assert_allclose(grad, -WANT / 9.0, rtol=1e-6, atol=1e-8)
  np.testing.assert_allclose(O.finalize(metrics["pg_loss"]), -WANT.sum() / 9.0, rtol=1e-6)
  # The same advantages as [B] values when they do not vary along T (gamma = 1).
  flat = O.chain(O.center_by_group_mean(), spread_over_tokens(gamma=1.0))
  adv_t, _ = O.compute_advantages(flat, b)
  adv_b, _ = O.compute_advantages(O.center_by_group_mean(), b)
  lp = b.current_logp + 0.1
  got = O.policy_loss(lp, b, adv_t.values, adv_t.weights, config=cfg)[0]
  want = O.policy_loss(lp, b, adv_b.values, adv_b.weights, config=cfg)[0]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_chain_output_shapes_are_checked():
  b = _batch()

  def widen(adv, batch, key):
    return adv._replace(values=jnp.zeros((batch.batch_size, batch.seq_len + 1)))

  with pytest.raises(ValueError, match=r"values of shape \(6, 4\).*expected values \(B,\)"):
    O.compute_advantages(O.stateless(widen), b)
  per_token_weights = O.stateless(lambda adv, b, k: adv._replace(weights=jnp.ones((6, 3))))
  with pytest.raises(ValueError, match=r"weights of shape \(6, 3\)"):
    O.compute_advantages(per_token_weights, b)
  late_center = O.chain(spread_over_tokens(gamma=0.5), O.center_by_group_mean())
  with pytest.raises(ValueError, match="center_by_group_mean needs per-rollout"):
    O.compute_advantages(late_center, b)


@VARIANTS
def test_row_transforms_after_a_token_level_one(variant):
  b = _batch()
  base = O.chain(O.center_by_group_mean(), spread_over_tokens(gamma=0.5))
  flip = O.chain(base, O.flip_signs(prob=1.0), O.clip_advantages(low=-0.3, high=10.0))
  out = variant(lambda b, k: O.compute_advantages(flip, b, key=k)[0])(b, jax.random.key(0))
  np.testing.assert_allclose(out.values, np.clip(-WANT, -0.3, 10.0), rtol=1e-6)
  half = O.chain(base, O.flip_signs(prob=0.5))
  out = variant(lambda b, k: O.compute_advantages(half, b, key=k)[0])(b, jax.random.key(1))
  sign = np.sign(np.asarray(out.values)[[0, 3, 4], 0] / WANT[[0, 3, 4], 0])
  np.testing.assert_allclose(np.asarray(out.values)[[0, 3, 4]], sign[:, None] * WANT[[0, 3, 4]])
  drop = O.chain(base, O.exclude_min_abs_reward())  # drops r = 0 (row 1) and r = 1 (row 4)
  out = variant(lambda b: O.compute_advantages(drop, b)[0])(b)
  np.testing.assert_allclose(out.values, WANT * np.array([[1], [0], [0], [1], [0], [0]]))
  np.testing.assert_array_equal(out.weights, [1, 0, 0, 1, 0, 0])


@VARIANTS
def test_ace_modulate_token_level(variant):
  adv = jnp.array([[-1.0, 2.0], [-2.0, -0.5]])
  shift = jnp.array([0.0, 1.0])
  out = variant(functools.partial(O.ace_modulate, alpha=1.0))(adv, shift)
  f = np.log1p(np.exp([0.0, 1.0]))  # softplus
  want = [[-1.0 * (1 + f[0]), 2.0], [-2.0 * (1 + f[1]), -0.5 * (1 + f[1])]]
  np.testing.assert_allclose(out, want, rtol=1e-6)


# RolloutBatch.entropy -----------------------------------------------------------------------------


def entropy_bonus(*, coef):
  """Toy chain stage: A_i <- A_i + coef * mean_t H_{i,t} over valid tokens (batch.entropy)."""

  def fn(adv, batch, key):
    batch.require("entropy")
    m = batch.token_mask
    n = jnp.maximum(jnp.sum(m, axis=-1), 1)
    h = jnp.sum(jnp.where(m, batch.entropy, 0.0), axis=-1) / n
    return adv._replace(values=adv.values + coef * h)

  return O.stateless(fn)


def _entropy_batch():
  b = make_batch([[1, 0]], 3, seq_len=3, lengths=[2, 3])
  ent = jnp.array([[1.0, 3.0, jnp.nan], [0.0, 3.0, 6.0], [jnp.nan, 1.0, 1.0]])  # NaN on padding
  return b.replace(entropy=ent)


@VARIANTS
def test_chain_reads_batch_entropy(variant):
  b = _entropy_batch()
  recipe = O.make_recipe(
      "entropy_grpo",
      O.chain(O.center_by_group_mean(), entropy_bonus(coef=0.1)),
      O.PolicyLossConfig(kl_coef=0.0),
      advantage_requires=("entropy",),
  )
  assert recipe.requires == ("entropy",) and recipe.loss_inputs == ()
  adv, _ = variant(lambda b: O.compute_advantages(recipe.advantage, b))(b)
  # centered [.5, -.5] plus 0.1 * mean entropy [2, 3]; the padded row is 0.
  np.testing.assert_allclose(adv.values, [0.7, -0.2, 0.0], rtol=1e-6)
  parts, _ = variant(lambda b, a: recipe.loss_fn(b.current_logp, b, a.values, a.weights))(b, adv)
  assert np.isfinite(parts.sum)
  with pytest.raises(ValueError, match=r"\['entropy'\] are None"):
    O.compute_advantages(recipe.advantage, b.replace(entropy=None))
  with pytest.raises(ValueError, match="recipe 'entropy_grpo' needs entropy"):
    recipe.check_provided({"ref_logp", "current_logp", "behaviour_logp", "key"})
  recipe.check_provided({"entropy"})


def test_entropy_field_shapes_and_finite_checks():
  b = _entropy_batch()
  O.check_shapes(b)
  with pytest.raises(ValueError, match=r"RolloutBatch.entropy has shape \(3, 2\)"):
    O.check_shapes(b.replace(entropy=jnp.zeros((3, 2))))
  with pytest.raises(ValueError, match="RolloutBatch.entropy has dtype"):
    O.check_shapes(b.replace(entropy=jnp.zeros((3, 3), jnp.int32)))
  assert bool(jax.jit(O.check_finite)(b).ok)  # NaN on padding only
  bad = b.replace(entropy=b.entropy.at[1, 2].set(jnp.inf))
  check = jax.jit(O.check_finite)(bad)
  assert int(check.first_bad_index) == 1 and FiniteCheck.FIELDS[int(check.field)] == "entropy"
  with pytest.raises(ValueError, match="entropy of rollout 1"):
    O.assert_finite(bad)
  # Existing field indices are unchanged (the trainer maps indices to names).
  assert FiniteCheck.FIELDS[:4] == ("rewards",) + LOGP_FIELDS
  assert TOKEN_FIELDS == LOGP_FIELDS + ("entropy",)
  names = [f.name for f in dataclasses.fields(RolloutBatch)]
  assert names[-1] == "entropy" and names.index("correct") == len(names) - 2
