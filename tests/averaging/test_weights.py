"""Checkpoint selection, weights, and EDM2 post-hoc EMA reconstruction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from rlpost import averaging as A

STEPS = list(range(100, 1100, 100))


def test_select_latest():
  assert A.select_latest(STEPS, 3) == [800, 900, 1000]
  assert A.select_latest(STEPS, 3, every=200) == [600, 800, 1000]
  assert A.select_latest(STEPS, 2, every=300, end=700) == [400, 700]


def test_select_latest_errors_name_steps():
  with pytest.raises(ValueError, match=r"k=12 checkpoints requested but only 10 exist"):
    A.select_latest(STEPS, 12)
  with pytest.raises(ValueError, match=r"need steps 0, 200, .*; missing 0 "):
    A.select_latest(STEPS, 6, every=200)
  with pytest.raises(ValueError, match=r"end step 750 is not a checkpoint"):
    A.select_latest(STEPS, 2, end=750)
  with pytest.raises(ValueError, match="empty"):
    A.select_latest([], 2)


def test_select_from_log_all():
  assert A.select_from(STEPS, 700) == [700, 800, 900, 1000]
  assert A.select_from(STEPS, 200, every=300) == [200, 500, 800]
  with pytest.raises(ValueError, match="no checkpoint between steps 1200 and 1000"):
    A.select_from(STEPS, 1200)
  # end - 2^n for n = 0, 1, ...: latest checkpoint at or before 999, 998, 996, ..., 1000 - 512.
  assert A.select_log_spaced(STEPS, base=2) == [400, 700, 800, 900, 1000]
  assert A.select_all(reversed(STEPS)) == STEPS


def test_ema_weights():
  w = A.ema_weights([1, 2, 3], 0.5)
  np.testing.assert_allclose(w, np.array([0.25, 0.5, 1.0]) / 1.75)
  w = A.ema_weights([10, 20, 40], 0.9, per="step")
  np.testing.assert_allclose(w, 0.9 ** np.array([30, 20, 0]) / np.sum(0.9 ** np.array([30, 20, 0])))
  np.testing.assert_allclose(A.ema_weights([1, 2, 3], 0.0), [0, 0, 1])


@given(st.lists(st.floats(0.05, 20.0), min_size=1, max_size=12))
def test_mwa_penalty_zero_is_uniform_and_weights_sum_to_one(losses):
  for fn in ("loss", "loss_softmin"):
    np.testing.assert_allclose(A.mwa_weights(losses, 0.0, weight_fn=fn), 1.0 / len(losses))
    for p in (0.5, 3.0):
      w = A.mwa_weights(losses, p, weight_fn=fn)
      np.testing.assert_allclose(w.sum(), 1.0)
      assert np.all(w >= 0)
  steps = np.arange(1, len(losses) + 1) * 10
  np.testing.assert_allclose(A.mwa_weights(steps, 0.0, weight_fn="step"), 1.0 / len(losses))


def test_mwa_hand_computed_and_pluggable():
  w = A.mwa_weights([1.0, 2.0], 1.0)  # f = 1/L
  np.testing.assert_allclose(w, [2 / 3, 1 / 3])
  w = A.mwa_weights([10, 30], 2.0, weight_fn="step")  # f = s^2
  np.testing.assert_allclose(w, [0.1, 0.9])
  w = A.mwa_weights([3.0, 5.0], 7.0, weight_fn=lambda m, p: np.where(m < 4, 1.0, 0.0))
  np.testing.assert_allclose(w, [1.0, 0.0])
  with pytest.raises(ValueError, match=r"non-finite metric at steps \[200\]"):
    A.mwa_weights([1.0, np.nan], 1.0, steps=[100, 200])
  plan = A.plan_mwa([100, 200], 1.0, metric={100: 1.0, 200: 2.0})
  np.testing.assert_allclose(plan.weights, [2 / 3, 1 / 3])
  with pytest.raises(ValueError, match=r"no metric recorded for steps \[200\]"):
    A.plan_mwa([100, 200], 1.0, metric={100: 1.0})


def test_sigma_rel_gamma_round_trip():
  # Karras et al. 2024 quote gamma = 16.97 for sigma_rel = 0.05 and 6.94 for 0.10.
  assert abs(A.sigma_rel_to_gamma(0.05) - 16.97) < 0.01
  assert abs(A.sigma_rel_to_gamma(0.10) - 6.94) < 0.01
  for s in (0.01, 0.05, 0.1, 0.2, 0.25):
    assert abs(A.gamma_to_sigma_rel(A.sigma_rel_to_gamma(s)) - s) < 1e-9
  with pytest.raises(ValueError, match="sigma_rel must be in"):
    A.sigma_rel_to_gamma(0.5)


def test_power_profile_is_the_tracked_ema():
  g = A.sigma_rel_to_gamma(0.07)
  w = A.power_profile(50, g)
  np.testing.assert_allclose(w.sum(), 1.0)
  # Recursion beta_t = (1 - 1/t)^(g + 1) on one-hot inputs gives the same weights.
  m = np.zeros(50)
  for t in range(1, 51):
    beta = (1 - 1 / t) ** (g + 1)
    m = beta * m
    m[t - 1] += 1 - beta
  np.testing.assert_allclose(m, w, atol=1e-12)


def test_posthoc_ema_reconstructs_a_tracked_width():
  """Track sigma_rel 0.05 and 0.10 (snapshots every 20 steps) and, as the check, 0.07; the
  least-squares reconstruction of 0.07 from the snapshots matches the tracked 0.07 EMA."""
  n, every = 400, 20
  rng = np.random.default_rng(0)
  # A noisy trajectory drifting towards a target, like SGD iterates.
  drift = np.cumsum(rng.normal(size=(n, 8)) * 0.3, axis=0) + np.linspace(0, 5, n)[:, None]
  t_all = A.named(a=A.power_ema(0.05), b=A.power_ema(0.10), check=A.power_ema(0.07))
  state = t_all.init(jnp.zeros(8))
  update = jax.jit(t_all.update)
  snaps, items = {}, []
  for s in range(1, n + 1):
    state = update(jnp.asarray(drift[s - 1], jnp.float32), state)
    if s % every == 0:
      for name in ("a", "b"):
        snaps[(s, name)] = np.asarray(state[name].ema, np.float64)
        items.append((s, name))
  gammas = {"a": A.sigma_rel_to_gamma(0.05), "b": A.sigma_rel_to_gamma(0.10)}
  tracked = np.asarray(state["check"].ema, np.float64)
  spread = np.abs(drift[-100:] - tracked).mean()  # how far raw iterates sit from the EMA
  for exact in (True, False):
    plan = A.plan_posthoc_ema(items, gammas, 0.07, exact=exact)
    assert not plan.normalize and abs(sum(plan.weights) - 1) < 0.05
    recon = A.average(lambda i: snaps[i], plan)
    err = np.abs(np.asarray(recon, np.float64) - tracked).mean()
    assert err < 0.03 * spread, (exact, err, spread)
  # A width that was tracked is reproduced exactly by the discrete solve.
  plan = A.plan_posthoc_ema(items, gammas, 0.10, exact=True)
  np.testing.assert_allclose(np.asarray(A.average(lambda i: snaps[i], plan)),
                             snaps[(n, "b")], rtol=1e-4, atol=1e-4)


def test_posthoc_ema_errors():
  g = A.sigma_rel_to_gamma(0.1)
  with pytest.raises(ValueError, match="outside the snapshots' range"):
    A.posthoc_ema_weights([10, 20], [g, g], 30, 0.1)
  with pytest.raises(ValueError, match="no gamma given for profiles"):
    A.plan_posthoc_ema([(10, "x")], {"y": g}, 0.1)
  with pytest.raises(ValueError, match="no snapshots"):
    A.plan_posthoc_ema([], {"y": g}, 0.1)
