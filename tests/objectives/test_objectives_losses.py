"""Ratios, PPO clipping, KL estimators, aggregation and policy_loss: hand-computed values
(eager and jit), gradient checks, micro-batch and padding invariance."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from objectives_testutil import VARIANTS, make_batch, rows

MASK = np.array([[1, 1, 0], [1, 1, 1]], bool)
LOGP = np.array([[-1.0, -2.0, -5.0], [-0.5, -1.5, -1.0]], np.float32)
OLD = np.array([[-1.2, -2.4, -0.1], [-0.5, -1.0, -0.7]], np.float32)


# Ratios ------------------------------------------------------------------------------------------


@VARIANTS
def test_token_and_prefix_ratios(variant):
  d = np.where(MASK, LOGP - OLD, 0)  # [[.2, .4, 0], [0, -.5, -.3]]
  lr = variant(O.token_log_ratio)(LOGP, OLD, MASK)
  np.testing.assert_allclose(lr, d, atol=1e-6)
  pr = variant(O.prefix_log_ratio)(LOGP, OLD, MASK)
  np.testing.assert_allclose(pr, [[0.2, 0.3, 0], [0, -0.25, -0.8 / 3]], atol=1e-6)


def test_prefix_ratio_gradient_is_causal_mean():
  jac = jax.jacobian(lambda lp: O.prefix_log_ratio(lp, OLD, MASK))(jnp.asarray(LOGP))
  # d log rho_{1,t} / d logp_{1,s} = 1/(t+1) for s <= t, 0 for s > t.
  want = np.array([[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]])
  np.testing.assert_allclose(jac[1, :, 1, :], want, atol=1e-6)
  np.testing.assert_allclose(jac[0, 2], 0.0)  # padding row entry: no gradient


@VARIANTS
def test_sequence_ratio_value_and_gradient(variant):
  lr = variant(O.sequence_log_ratio)(LOGP, OLD, MASK)
  np.testing.assert_allclose(lr, [[0.3, 0.3, 0], [-0.8 / 3] * 3], atol=1e-6)
  g = jax.grad(lambda lp: jnp.exp(O.sequence_log_ratio(lp, OLD, MASK))[:, 0].sum())(LOGP)
  # d s_i / d logp_t = s_i / |y_i| on valid tokens, 0 on padding.
  s = np.exp([0.3, -0.8 / 3])
  np.testing.assert_allclose(g, [[s[0] / 2, s[0] / 2, 0], [s[1] / 3] * 3], rtol=1e-5)


@VARIANTS
def test_gspo_token_variant_has_sequence_value_and_per_token_gradient(variant):
  seq = variant(O.sequence_log_ratio)(LOGP, OLD, MASK)
  per_token = variant(O.sequence_token_log_ratio)(LOGP, OLD, MASK)
  np.testing.assert_allclose(per_token, seq, atol=1e-6)
  jac = jax.jacobian(lambda lp: jnp.exp(O.sequence_token_log_ratio(lp, OLD, MASK)))(
      jnp.asarray(LOGP)
  )
  s = np.exp([0.3, -0.8 / 3])
  # d s_{i,t} / d logp_{i,t'} = s_i * delta_{t t'} on valid tokens.
  np.testing.assert_allclose(jac[1, :, 1, :], s[1] * np.eye(3), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(jac[0, :, 0, :], s[0] * np.diag([1, 1, 0]), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(jac[0, :, 1, :], 0.0)


@VARIANTS
def test_truncated_importance_weights(variant):
  cur = np.array([[0.0, -1.0, 9.0]], np.float32)
  beh = np.array([[-1.0, -0.5, 0.0]], np.float32)
  m = np.array([[1, 1, 0]], bool)
  w = variant(functools.partial(O.truncated_importance_weights, cap=2.0))(cur, beh, m)
  np.testing.assert_allclose(w, [[2.0, np.exp(-0.5), 1.0]], rtol=1e-6)
  ws = variant(functools.partial(O.truncated_importance_weights, cap=2.0, level="sequence"))(
      cur, beh, m
  )
  np.testing.assert_allclose(ws, [[np.exp(0.5), np.exp(0.5), 1.0]], rtol=1e-6)


# PPO clipping ------------------------------------------------------------------------------------


@VARIANTS
def test_ppo_clip_low_high_and_dual(variant):
  ratio = np.array([[1.5, 0.5, 0.5, 5.0, 2.0, 1.1]], np.float32)
  adv = np.array([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]], np.float32)
  f = variant(functools.partial(O.ppo_clip_token_loss, eps_low=0.2, eps_high=0.28, dual_clip=3.0))
  loss = f(np.log(ratio), adv)
  np.testing.assert_allclose(loss, [[-1.28, -0.5, 0.8, 3.0, 2.0, -1.1]], rtol=1e-6)
  f = variant(functools.partial(O.ppo_clip_token_loss, eps_low=0.2, eps_high=0.28))
  np.testing.assert_allclose(f(np.log(ratio), adv), [[-1.28, -0.5, 0.8, 5.0, 2.0, -1.1]], rtol=1e-6)
  c = O.clip_indicators(np.log(ratio), adv, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
  np.testing.assert_array_equal(c.high, [[1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(c.low, [[0, 0, 1, 0, 0, 0]])
  np.testing.assert_array_equal(c.dual, [[0, 0, 0, 1, 0, 0]])
  with pytest.raises(ValueError, match="dual_clip"):
    O.ppo_clip_token_loss(np.log(ratio), adv, eps_low=0.2, eps_high=0.2, dual_clip=0.5)


def test_ppo_clip_gradient_vanishes_where_clipped():
  lr = jnp.log(jnp.array([[1.5, 1.1, 0.5, 5.0]]))
  adv = jnp.array([[1.0, 1.0, -1.0, -1.0]])
  g = jax.grad(
      lambda x: O.ppo_clip_token_loss(x, adv, eps_low=0.2, eps_high=0.2, dual_clip=3.0).sum()
  )(lr)
  # Clipped high, unclipped (-A rho = -1.1), clipped low, dual-clipped.
  np.testing.assert_allclose(g, [[0.0, -1.1, 0.0, 0.0]], rtol=1e-6)


# KL estimators -----------------------------------------------------------------------------------


@VARIANTS
def test_kl_estimators(variant):
  ref = np.zeros((1, 4), np.float32)
  d = np.array([[0.5, -0.3, 0.0, -15.0]], np.float32)
  np.testing.assert_allclose(variant(O.kl_k1)(d, ref), d)
  np.testing.assert_allclose(variant(O.kl_k2)(d, ref), d**2 / 2, rtol=1e-6)
  k3 = np.exp(-d) + d - 1
  k3[0, 3] = 10.0  # exp(15) - 16 is clamped to 10, as verl
  np.testing.assert_allclose(variant(O.kl_k3)(d, ref), k3, rtol=1e-5)
  assert np.all(np.asarray(variant(O.kl_k3)(d, ref)) >= 0)
  for est, fn in (("k1", O.kl_k1), ("k2", O.kl_k2), ("k3", O.kl_k3)):
    np.testing.assert_array_equal(O.kl_estimate(d, ref, estimator=est), fn(d, ref))
  with pytest.raises(ValueError, match="unknown KL estimator"):
    O.kl_estimate(d, ref, estimator="k4")


@VARIANTS
def test_verl_abs_and_plus_estimators_values_and_gradients(variant):
  """verl 0.9.1 ``kl_penalty``: "abs" = |d|; "k1+" / "k3+" take k1's / k3's value and k2's
  gradient d = logp - ref (straight through); "k2+" is k2. Hand values at d = 0.5, -0.3, 0, -15."""
  ref = np.zeros((1, 4), np.float32)
  d = np.array([[0.5, -0.3, 0.0, -15.0]], np.float32)
  k3 = np.exp(-d) + d - 1
  k3[0, 3] = 10.0
  want = {"abs": np.abs(d), "k1+": d, "k2+": d**2 / 2, "k3+": k3}
  grads = {"abs": np.sign(d), "k1+": d, "k2+": d, "k3+": d}
  assert set(O.KL_ESTIMATORS) == {"k1", "k2", "k3", *want}
  for est in want:
    value = variant(lambda lp, r, e=est: O.kl_estimate(lp, r, estimator=e))(d, ref)
    np.testing.assert_allclose(value, want[est], rtol=1e-5, err_msg=est)
    g = variant(jax.grad(lambda lp, e=est: O.kl_estimate(lp, jnp.asarray(ref), estimator=e).sum()))(
        jnp.asarray(d))
    np.testing.assert_allclose(g, grads[est], rtol=1e-6, err_msg=est)
    gr = jax.grad(lambda r, e=est: O.kl_estimate(jnp.asarray(d), r, estimator=e).sum())(
        jnp.asarray(ref))
    np.testing.assert_array_equal(gr, 0.0)  # the reference carries no gradient
  # k3's own gradient 1 - exp(-d) differs from k3+'s d (at d = -15 k3 is clamped: gradient 0).
  g3 = jax.grad(lambda lp: O.kl_k3(lp, jnp.asarray(ref)).sum())(jnp.asarray(d))
  np.testing.assert_allclose(g3[0, :3], 1 - np.exp(-d[0, :3]), rtol=1e-6)
  assert g3[0, 3] == 0.0


@VARIANTS
def test_geo_mean_policy_term_hand_values_and_gradients(variant):
  """GMPO by hand, eps 0.4. Row 0 (A = +1): d = (0.5, -0.1, 0.0) -> m = min(d, clip d) =
  (0.4, -0.1, 0.0), ratio e^0.1, loss -e^0.1; the clipped token gets no gradient, the others
  -e^0.1 / 3. Row 1 (A = -1): d = (0.5, -0.6) -> m = max(d, clip d) = (0.5, -0.4), ratio
  e^0.05, loss +e^0.05; token 0 (unclipped, pessimistic side) gets +e^0.05 / 2, the clipped
  token 1 none. The batch loss is the mean of the two rows."""
  old = jnp.zeros((2, 3))
  logp = jnp.array([[0.5, -0.1, 0.0], [0.5, -0.6, 9.0]])
  mask = jnp.array([[True, True, True], [True, True, False]])
  adv = jnp.array([1.0, -1.0])

  def loss(lp):
    term = O.geo_mean_policy_term(lp, old, adv, mask, eps_low=0.4, eps_high=0.4)
    parts = O.aggregate(term.values, mask, jnp.ones(2), mode="seq_mean_token_mean")
    return O.finalize(parts), term

  (value, term), grad = variant(jax.value_and_grad(loss, has_aux=True))(logp)
  e1, e05 = np.exp(0.1), np.exp(0.05)
  np.testing.assert_allclose(term.values, [[-e1, -e1, -e1], [e05, e05, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(value, (-e1 + e05) / 2, rtol=1e-5)  # a float32 difference
  np.testing.assert_allclose(grad, [[0.0, -e1 / 6, -e1 / 6], [e05 / 4, 0.0, 0.0]], rtol=1e-6,
                             atol=1e-7)
  np.testing.assert_allclose(term.metrics["ratio"][:, 0], [e1, e05], rtol=1e-6)
  np.testing.assert_array_equal(term.metrics["clip_frac_high"], [[1, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(term.metrics["clip_frac_low"], [[0, 0, 0], [1, 1, 0]])
  with pytest.raises(ValueError, match="'geo_mean' .GMPO. is a per-sequence loss"):
    O.PolicyLossConfig(ratio="geo_mean", aggregation="token_mean")
  gmpo = O.get_recipe("gmpo").loss_config
  assert (gmpo.ratio, gmpo.eps_low, gmpo.eps_high, gmpo.kl_coef) == ("geo_mean", 0.4, 0.4, 0.0)


def test_k3_gradient_sign_pulls_towards_reference():
  ref = jnp.zeros((1, 3))
  logp = jnp.array([[0.4, -0.4, 0.0]])
  g = jax.grad(lambda lp: O.kl_k3(lp, ref).sum())(logp)
  np.testing.assert_allclose(g, 1 - np.exp(-np.asarray(logp)), rtol=1e-6)
  assert g[0, 0] > 0 and g[0, 1] < 0 and g[0, 2] == 0
  # The reference carries no gradient.
  gr = jax.grad(lambda r: O.kl_k3(logp, r).sum())(ref)
  np.testing.assert_array_equal(gr, 0.0)


@VARIANTS
def test_token_entropy(variant):
  logits = jnp.zeros((1, 2, 4)).at[0, 1].set(jnp.array([0.0, -1e9, -1e9, -1e9]))
  np.testing.assert_allclose(variant(O.token_entropy)(logits), [[np.log(4), 0.0]], atol=1e-6)


# Aggregation -------------------------------------------------------------------------------------


@VARIANTS
@pytest.mark.parametrize(
    "mode,weights,want",
    [
        ("token_mean", [1, 1], (15.0, 5.0)),
        ("seq_mean_token_mean", [1, 1], (2.0 + 4.5, 2.0)),
        ("seq_sum_const_len", [1, 1], (15.0, 8.0)),
        ("token_mean", [1, 0], (6.0, 3.0)),
        ("seq_mean_token_mean", [0.5, 1], (1.0 + 4.5, 1.5)),
        ("seq_sum_const_len", [0, 1], (9.0, 4.0)),
    ],
)
def test_aggregate(variant, mode, weights, want):
  vals = np.array([[1, 2, 3], [4, 5, 99]], np.float32)
  mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
  f = variant(functools.partial(O.aggregate, mode=mode, max_length=4))
  parts = f(vals, mask, np.asarray(weights, np.float32))
  np.testing.assert_allclose([parts.sum, parts.denominator], want, rtol=1e-6)


def test_aggregate_errors_and_finalize():
  with pytest.raises(ValueError, match="max_length"):
    O.aggregate(jnp.zeros((1, 2)), jnp.ones((1, 2), bool), jnp.ones(1), mode="seq_sum_const_len")
  with pytest.raises(ValueError, match="unknown aggregation"):
    O.aggregate(jnp.zeros((1, 2)), jnp.ones((1, 2), bool), jnp.ones(1), mode="mean")
  assert float(O.finalize(O.LossParts(jnp.float32(3.0), jnp.float32(0.0)))) == 0.0
  g = jax.grad(lambda s: O.finalize(O.LossParts(s, jnp.float32(0.0))))(1.0)
  assert np.isfinite(g)
  c = O.combine([O.LossParts(1.0, 2.0), O.LossParts(3.0, 4.0)])
  assert c == (4.0, 6.0)


# policy_loss -------------------------------------------------------------------------------------


def _batch():
  b = make_batch([[1, 0, 0, 1], [2, 0, 1], [1, 1]], 4, seq_len=5, seed=7)
  return b


def _logp(b, scale=0.3, seed=0):
  noise = np.random.default_rng(seed).normal(size=b.current_logp.shape).astype(np.float32)
  return b.current_logp + scale * noise


CONFIGS = {
    "grpo": O.PolicyLossConfig(kl_coef=0.04),
    "dapo": O.PolicyLossConfig(eps_high=0.28, dual_clip=3.0, aggregation="token_mean"),
    "dr_grpo": O.PolicyLossConfig(
        aggregation="seq_sum_const_len", max_length=5, kl_coef=0.1, kl_estimator="k2"
    ),
    "gspo": O.PolicyLossConfig(ratio="sequence", eps_low=3e-4, eps_high=4e-4),
    "gspo_token": O.PolicyLossConfig(ratio="sequence_token", eps_low=3e-4, eps_high=4e-4),
    "pnpo": O.PolicyLossConfig(ratio="prefix", aggregation="token_mean"),
    "tis_entropy": O.PolicyLossConfig(
        tis_cap=1.5, entropy_coef=0.01, kl_coef=0.1, kl_estimator="k1"
    ),
}


@VARIANTS
def test_policy_loss_hand_computed_on_policy(variant):
  """On-policy (ratio 1), GRPO loss = -(1/N) sum_i A_i + kl_coef * mean KL; here KL = 0."""
  b = make_batch([[1, 0], [2, 0]], 2, seq_len=3, lengths=[3, 2, 1, 3])
  b = b.replace(ref_logp=b.current_logp)
  adv = jnp.array([1.0, -1.0, 2.0, -0.5])
  w = jnp.array([1.0, 1.0, 1.0, 0.0])
  cfg = O.PolicyLossConfig(kl_coef=0.04)
  parts, metrics = variant(functools.partial(O.policy_loss, config=cfg))(b.current_logp, b, adv, w)
  np.testing.assert_allclose([parts.sum, parts.denominator], [-(1 - 1 + 2), 3.0], atol=1e-6)
  m = O.finalize_metrics(metrics)
  np.testing.assert_allclose(m["ratio"], 1.0, rtol=1e-6)
  np.testing.assert_allclose(m["kl"], 0.0, atol=1e-7)
  assert m["clip_frac_low"] == 0 and m["clip_frac_high"] == 0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_micro_batches_give_the_full_batch_loss_and_gradient(name):
  cfg = CONFIGS[name]
  b = _batch()
  adv = jnp.asarray(np.random.default_rng(1).normal(size=b.batch_size).astype(np.float32))
  w = b.valid.astype(jnp.float32)
  ent = jnp.asarray(
      np.random.default_rng(2).uniform(0, 2, size=b.token_mask.shape).astype(np.float32)
  )
  logp = _logp(b)

  def parts_fn(lp, batch, a, ww, e):
    return O.policy_loss(lp, batch, a, ww, config=cfg, entropy=e)[0]

  def full(lp):
    return O.finalize(parts_fn(lp, b, adv, w, ent))

  splits = [np.arange(0, 3), np.arange(3, 10), np.arange(10, 12)]

  def micro(lp):
    parts = [parts_fn(lp[s], rows(b, s), adv[s], w[s], ent[s]) for s in splits]
    return O.finalize(O.combine(parts))

  f_full = jax.jit(jax.value_and_grad(full))
  f_micro = jax.jit(jax.value_and_grad(micro))
  (v1, g1), (v2, g2) = f_full(logp), f_micro(logp)
  np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g1, g2, rtol=1e-5, atol=1e-8)
  assert np.all(np.asarray(g1)[~np.asarray(b.token_mask & b.valid[:, None])] == 0)


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "pnpo", "dr_grpo", "grpo"])
def test_padding_tokens_and_padded_rows_are_ignored(name):
  """Extending T with garbage (NaN/inf) tokens and adding padded rows changes neither the
  loss nor the gradient on real tokens."""
  cfg = CONFIGS[name]
  b = _batch()
  adv = jnp.asarray(np.random.default_rng(3).normal(size=b.batch_size).astype(np.float32))
  w = b.valid.astype(jnp.float32)
  logp = _logp(b)
  extra_t = 3

  def pad_t(x, fill):
    return jnp.concatenate([x, jnp.full((x.shape[0], extra_t), fill, x.dtype)], axis=1)

  bp = b.replace(
      tokens=pad_t(b.tokens, 0),
      token_mask=pad_t(b.token_mask, False),
      behaviour_logp=pad_t(b.behaviour_logp, jnp.nan),
      current_logp=pad_t(b.current_logp, jnp.inf),
      ref_logp=pad_t(b.ref_logp, -jnp.inf),
  )
  # Garbage inside padding positions of the original length too.
  bp = bp.replace(current_logp=jnp.where(bp.token_mask, bp.current_logp, jnp.nan))
  logp_p = jnp.where(bp.token_mask, pad_t(logp, 0.0), jnp.nan)

  def val(lp, batch):
    return O.finalize(O.policy_loss(lp, batch, adv, w, config=cfg)[0])

  f = jax.jit(jax.value_and_grad(val))
  v1, g1 = f(logp, b)
  v2, g2 = f(logp_p, bp)
  np.testing.assert_allclose(v1, v2, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(g2)[:, : b.seq_len], g1, rtol=1e-6, atol=1e-9)
  assert np.all(np.isfinite(g2)) and np.all(np.asarray(g2)[:, b.seq_len :] == 0)


def test_policy_loss_sample_weight_excludes_rows_entirely():
  cfg = CONFIGS["dapo"]
  b = _batch()
  adv = jnp.ones((b.batch_size,))
  w = b.valid.astype(jnp.float32).at[0].set(0.0)
  logp = _logp(b)
  f = jax.jit(lambda lp, batch, a, ww: O.policy_loss(lp, batch, a, ww, config=cfg)[0])
  full = f(logp, b, adv, w)
  keep = np.arange(1, b.batch_size)
  sub = f(logp[keep], rows(b, keep), adv[keep], w[keep])
  np.testing.assert_allclose(full, sub, rtol=1e-6)


def test_policy_loss_input_errors():
  b = _batch()
  adv = jnp.zeros((b.batch_size,))
  w = jnp.ones((b.batch_size,))
  with pytest.raises(ValueError, match="entropy"):
    O.policy_loss(b.current_logp, b, adv, w, config=O.PolicyLossConfig(entropy_coef=0.1))
  with pytest.raises(ValueError, match="ref_logp"):
    O.policy_loss(
        b.current_logp, b.replace(ref_logp=None), adv, w, config=O.PolicyLossConfig(kl_coef=0.1)
    )
  with pytest.raises(ValueError, match="behaviour_logp"):
    O.policy_loss(
        b.current_logp,
        b.replace(behaviour_logp=None),
        adv,
        w,
        config=O.PolicyLossConfig(tis_cap=2.0),
    )
  with pytest.raises(ValueError, match=r"logp has shape \(12, 3\), expected \(12, 5\)"):
    O.policy_loss(b.current_logp[:, :3], b, adv, w, config=O.PolicyLossConfig())
  with pytest.raises(ValueError, match="sample_weight has shape"):
    O.policy_loss(b.current_logp, b, adv, w[:3], config=O.PolicyLossConfig())
  with pytest.raises(ValueError, match="unknown ratio"):
    O.PolicyLossConfig(ratio="segment")
  with pytest.raises(ValueError, match="max_length"):
    O.PolicyLossConfig(aggregation="seq_sum_const_len")


def test_tis_weights_multiply_the_policy_gradient_term():
  b = make_batch([[1, 0]], 2, seq_len=2, lengths=[2, 2])
  b = b.replace(
      current_logp=jnp.array([[-1.0, -1.0], [-1.0, -1.0]]),
      behaviour_logp=jnp.array([[-2.0, -1.0], [-1.0, -0.5]]),
  )
  adv = jnp.array([1.0, -1.0])
  w = jnp.ones(2)
  cfg = O.PolicyLossConfig(tis_cap=2.0, aggregation="token_mean")
  parts, m = O.policy_loss(b.current_logp, b, adv, w, config=cfg)
  tis = np.array([[2.0, 1.0], [1.0, np.exp(-0.5)]])
  want = np.sum(-np.array([[1.0], [-1.0]]) * tis)
  np.testing.assert_allclose([parts.sum, parts.denominator], [want, 4.0], rtol=1e-6)
  np.testing.assert_allclose(O.finalize(m["tis_weight"]), tis.mean(), rtol=1e-6)
