"""Loss terms: hand-computed values of each term, ``sum_terms``, and a fork's loss that adds its
own term to the standard ones (eager and jitted)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from objectives_testutil import VARIANTS, make_batch

LOG = np.log
MASK = jnp.array([[True, True, True], [True, True, False]])


def _lp(d):
  """(logp, old_logp) with logp - old_logp = d; padding (d = nan) holds NaN in logp."""
  d = jnp.asarray(d, jnp.float32)
  old = -jnp.ones_like(d)
  return jnp.where(jnp.isnan(d), jnp.nan, old + d), old


def _on_mask(x):
  return np.asarray(x)[np.asarray(MASK)]


@VARIANTS
@pytest.mark.parametrize("token_level", [False, True], ids=["adv_B", "adv_BT"])
def test_policy_gradient_term_hand_values(variant, token_level):
  # Row 0: A = 1, ratios 1.5, 0.5, 4; row 1: A = -1, ratios 4, 0.5 and a padded token.
  logp, old = _lp([[LOG(1.5), LOG(0.5), LOG(4.0)], [LOG(4.0), LOG(0.5), np.nan]])
  adv = jnp.array([1.0, -1.0])
  if token_level:
    adv = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
  fn = functools.partial(O.policy_gradient_term, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
  term = variant(fn)(logp, old, adv, MASK)
  # l = max(-A r, -A clip(r, 0.8, 1.2)); for A < 0 then min(l, -3 A).
  np.testing.assert_allclose(_on_mask(term.values), [-1.2, -0.5, -1.2, 3.0, 0.8], rtol=1e-6)
  assert term.report == "pg_loss"
  m = {k: _on_mask(v) for k, v in term.metrics.items()}
  assert set(m) == {"ratio", "clip_frac_low", "clip_frac_high", "dual_clip_frac"}
  np.testing.assert_allclose(m["ratio"], [1.5, 0.5, 4.0, 4.0, 0.5], rtol=1e-6)
  np.testing.assert_array_equal(m["clip_frac_high"], [1, 0, 1, 0, 0])
  np.testing.assert_array_equal(m["clip_frac_low"], [0, 0, 0, 0, 1])
  np.testing.assert_array_equal(m["dual_clip_frac"], [0, 0, 0, 1, 0])
  assert np.all(np.isfinite(term.values))

  plain = O.policy_gradient_term(logp, old, adv, MASK, eps_low=0.2, eps_high=0.2)
  assert "dual_clip_frac" not in plain.metrics
  np.testing.assert_allclose(_on_mask(plain.values)[3], 4.0, rtol=1e-6)  # no dual clip


@VARIANTS
def test_policy_gradient_term_sequence_ratio_matches_the_pieces(variant):
  b = make_batch([[1, 0, 2]], 4, seq_len=5, seed=3)
  logp = b.current_logp + 0.01 * jnp.arange(5.0)
  tm = b.token_mask & b.valid[:, None]
  adv = jnp.array([1.0, -0.5, 0.5, 0.0])
  fn = functools.partial(
      O.policy_gradient_term, ratio="sequence", eps_low=3e-4, eps_high=4e-4
  )
  term = variant(fn)(logp, b.current_logp, adv, tm)
  lr = O.sequence_log_ratio(logp, b.current_logp, tm, max_log_ratio=10.0)
  want = O.ppo_clip_token_loss(lr, adv, eps_low=3e-4, eps_high=4e-4)
  np.testing.assert_allclose(term.values, want, rtol=1e-6)


@VARIANTS
def test_truncated_importance_term_multiplies_the_term(variant):
  values = jnp.array([[2.0, -1.0, 3.0], [1.0, 1.0, 7.0]])
  pg = O.Term(values=values, metrics={"ratio": jnp.ones((2, 3))}, report="pg_loss")
  cur = jnp.log(jnp.array([[3.0, 0.5, 1.0], [1.0, 1.0, 9.0]]))
  beh = jnp.zeros((2, 3))
  fn = functools.partial(O.truncated_importance_term, cap=2.0)
  out = variant(fn)(pg, cur, beh, MASK)
  w = np.array([[2.0, 0.5, 1.0], [1.0, 1.0, 1.0]])  # capped at 2; 1 on padding
  np.testing.assert_allclose(out.values, np.asarray(values) * w, rtol=1e-6)
  np.testing.assert_allclose(out.metrics["tis_weight"], w, rtol=1e-6)
  assert out.report == "pg_loss" and "ratio" in out.metrics


@VARIANTS
def test_kl_and_entropy_terms(variant):
  logp = jnp.array([[0.2, -0.4, 0.0], [0.1, 0.0, 5.0]])
  ref = jnp.array([[0.0, 0.0, 0.0], [0.0, 0.0, jnp.nan]])  # NaN on padding
  tm = MASK & jnp.array([[True], [True]])
  kl = variant(functools.partial(O.kl_term, coef=0.5, estimator="k1"))(
      jnp.where(tm, logp, 0.0), ref, tm
  )
  np.testing.assert_allclose(kl.values, [[0.1, -0.2, 0.0], [0.05, 0.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(kl.metrics["kl"], [[0.2, -0.4, 0.0], [0.1, 0.0, 0.0]], rtol=1e-6)
  h = jnp.array([[1.0, 2.0, 3.0], [0.5, 1.0, jnp.nan]])
  ent = variant(functools.partial(O.entropy_term, coef=0.1))(h, MASK)
  np.testing.assert_allclose(ent.values, [[-0.1, -0.2, -0.3], [-0.05, -0.1, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(ent.metrics["entropy"], [[1, 2, 3], [0.5, 1, 0]], rtol=1e-6)
  zero = variant(functools.partial(O.entropy_term, coef=0.0))(h, MASK)
  np.testing.assert_array_equal(zero.values, np.zeros((2, 3)))


@VARIANTS
@pytest.mark.parametrize(
    "mode,want_loss,want_den",
    [("token_mean", 7.5, 2.5), ("seq_mean_token_mean", 5.0, 1.5)],
)
def test_sum_terms_hand_values(variant, mode, want_loss, want_den):
  tm = jnp.array([[True, True, False], [True, False, False]])
  w = jnp.array([1.0, 0.5])
  x = O.LossInputs(
      logp=jnp.zeros((2, 3)),
      old_logp=jnp.zeros((2, 3)),
      advantages=jnp.zeros((2,)),
      sample_weight=w,
      token_mask=tm,
  )
  a = O.Term(
      values=jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
      metrics={"m": jnp.array([[True, False, True], [False, False, False]])},
      report="a_loss",
  )
  b = O.Term(values=jnp.ones((2, 3)), metrics={})
  loss, metrics = variant(lambda a, b, x: O.sum_terms([a, b], x, aggregation=mode))(a, b, x)
  np.testing.assert_allclose([loss.sum, loss.denominator], [want_loss, want_den], rtol=1e-6)
  assert set(metrics) == {"a_loss", "m"}
  # token means: m = (1 * 1 + 0.5 * 0) / (1 * 2 + 0.5 * 1)
  np.testing.assert_allclose(O.finalize(metrics["m"]), 1.0 / 2.5, rtol=1e-6)
  a_only = O.sum_terms([a], x, aggregation=mode)[0]
  np.testing.assert_allclose(metrics["a_loss"], a_only, rtol=1e-6)
  with pytest.raises(ValueError, match="at least one Term"):
    O.sum_terms([], x, aggregation=mode)


# A fork's loss: the standard terms plus its own (the module docstring's example).


def length_term(token_mask, *, coef):
  """coef per valid token (a length cost): [B, T] bool -> Term(values [B, T] float32)."""
  cost = coef * token_mask.astype(jnp.float32)
  return O.Term(values=cost, metrics={"length_cost": cost})


def length_loss(logp, batch, advantages, sample_weight, *, config, entropy=None, coef=1e-2):
  x = O.loss_inputs(logp, batch, advantages, sample_weight, entropy=entropy)
  terms = O.policy_terms(x, batch, config=config) + (length_term(x.token_mask, coef=coef),)
  return O.sum_terms(terms, x, aggregation=config.aggregation, max_length=config.max_length)


CONFIGS = {
    "grpo": O.PolicyLossConfig(kl_coef=0.04),
    "dapo": O.PolicyLossConfig(eps_high=0.28, dual_clip=3.0, aggregation="token_mean"),
    "dars": O.PolicyLossConfig(
        dual_clip=3.0, aggregation="seq_sum_const_len", max_length=6, entropy_coef=0.01
    ),
    "tis_gspo": O.PolicyLossConfig(ratio="sequence_token", tis_cap=1.5, kl_coef=0.1),
}


@VARIANTS
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_fork_term_adds_to_policy_loss(variant, name):
  cfg = CONFIGS[name]
  b = make_batch([[1, 0, 0.5], [1, 1, 0]], 3, seq_len=6, seed=5)
  rng = np.random.default_rng(1)
  logp = b.current_logp + jnp.asarray(0.2 * rng.normal(size=b.token_mask.shape), jnp.float32)
  ent = jnp.asarray(rng.uniform(0.1, 2.0, size=b.token_mask.shape), jnp.float32)
  adv = jnp.asarray(rng.normal(size=(b.batch_size,)), jnp.float32)
  w = b.valid.astype(jnp.float32)

  def run(loss):
    def f(lp):
      parts, metrics = loss(lp, b, adv, w, config=cfg, entropy=ent)
      return parts.sum, (parts, metrics)

    return jax.grad(f, has_aux=True)(logp)

  g_std, (p_std, m_std) = variant(lambda lp: run(O.policy_loss))(logp)
  g_new, (p_new, m_new) = variant(lambda lp: run(length_loss))(logp)
  x = O.loss_inputs(logp, b, adv, w)
  extra = O.aggregate(
      length_term(x.token_mask, coef=1e-2).values,
      x.token_mask,
      x.sample_weight,
      mode=cfg.aggregation,
      max_length=cfg.max_length,
  )
  np.testing.assert_allclose(p_new.sum, p_std.sum + extra.sum, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(p_new.denominator, p_std.denominator, rtol=1e-6)
  assert set(m_new) == set(m_std) | {"length_cost"}
  np.testing.assert_allclose(O.finalize(m_new["length_cost"]), 1e-2, rtol=1e-5)
  np.testing.assert_allclose(g_new, g_std, rtol=1e-5, atol=1e-7)  # a constant term
  assert np.any(np.asarray(g_std) != 0)


def test_policy_loss_is_the_sum_of_its_terms():
  cfg = CONFIGS["dars"]
  b = make_batch([[1, 0, 0.5]], 3, seq_len=6, seed=2)
  ent = jnp.full(b.token_mask.shape, 0.7)
  adv, w = jnp.array([1.0, -1.0, 0.5]), jnp.ones((3,))
  x = O.loss_inputs(b.current_logp, b, adv, w, entropy=ent)
  terms = O.policy_terms(x, b, config=cfg)
  assert [t.report for t in terms] == ["pg_loss", None]  # pg, entropy (no KL)
  want = O.sum_terms(terms, x, aggregation=cfg.aggregation, max_length=cfg.max_length)
  got = O.policy_loss(b.current_logp, b, adv, w, config=cfg, entropy=ent)
  np.testing.assert_array_equal(got[0], want[0])
  assert list(got[1]) == list(want[1])
