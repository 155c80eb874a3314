"""Streaming means: equal to the batch mean, fp32 for bf16, O(1) sliding window, NaN errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlpost import averaging as A


def _trees(n, seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  return [{"a": jnp.asarray(rng.normal(size=(4, 3)), dtype), "b": (jnp.asarray(rng.normal(size=5), dtype),)}
          for _ in range(n)]


@settings(max_examples=15)
@given(st.lists(st.floats(0.1, 5.0), min_size=1, max_size=6))
def test_streaming_mean_equals_batch_mean(ws):
  trees = _trees(len(ws))
  acc = A.StreamingMean(trees[0])
  for i, (t, w) in enumerate(zip(trees, ws)):
    acc.add(t, w, step=i)
  out = acc.result()
  w = np.asarray(ws) / np.sum(ws)
  expect = jax.tree.map(lambda *xs: np.tensordot(w, np.stack([np.asarray(x, np.float64) for x in xs]), 1),
                        *trees)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), out, expect)


def test_bf16_accumulates_in_fp32():
  n = 512
  trees = [{"x": jnp.full((8,), 1.0 + (i % 2) * 2 ** -7, jnp.bfloat16)} for i in range(n)]
  acc = A.StreamingMean(trees[0])
  assert acc.acc[0].dtype == jnp.float32
  for i, t in enumerate(trees):
    acc.add(t, 1.0, step=i)
  np.testing.assert_allclose(np.asarray(acc.acc[0]) / n, 1.0 + 2 ** -8, rtol=1e-7)
  out = acc.result()
  assert out["x"].dtype == jnp.bfloat16
  assert float(out["x"][0]) == float(jnp.bfloat16(1.0 + 2 ** -8))


def test_accumulator_is_donated():
  trees = _trees(2)
  acc = A.StreamingMean(trees[0])
  first = acc.acc[0]
  acc.add(trees[0], step=0)
  assert first.is_deleted()  # the old buffer was given to the jitted step


def test_nan_checkpoint_names_step_and_leaf():
  trees = _trees(3)
  trees[2]["b"] = (trees[2]["b"][0].at[1].set(jnp.nan),)
  acc = A.StreamingMean(trees[0])
  acc.add(trees[0], step=100)
  acc.add(trees[1], step=200)
  with pytest.raises(FloatingPointError, match=r"step 300 .*\['b'\]\[0\] \(1 values\)"):
    acc.add(trees[2], step=300)
  with pytest.raises(FloatingPointError):
    acc.result()


def test_mismatched_tree_or_shape_names_step():
  trees = _trees(2)
  acc = A.StreamingMean(trees[0])
  with pytest.raises(ValueError, match="step 7: parameter tree does not match"):
    acc.add({"a": trees[1]["a"]}, step=7)
  with pytest.raises(ValueError, match=r"step 8: leaf \['a'\] has shape \(3, 4\), expected \(4, 3\)"):
    acc.add({"a": trees[1]["a"].T, "b": trees[1]["b"]}, step=8)
  with pytest.raises(ValueError, match="nothing was averaged"):
    acc.result()


def test_sliding_window_equals_recompute_with_o1_reads():
  trees = _trees(40, seed=3)
  reads = []

  def load(step):
    reads.append(step)
    return trees[step]

  k = 5
  win = A.SlidingWindowMean(k, load, recompute_every=10 ** 9)
  for step in range(len(trees)):
    win.push(step)
    lo = max(0, step - k + 1)
    expect = jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *trees[lo:step + 1])
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=2e-6),
                 win.mean(), expect)
  # One read per push plus one re-read of each step leaving the window.
  assert len(reads) == 2 * len(trees) - k
  # Periodic recompute from scratch gives the same mean.
  win.recompute()
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=2e-6), win.mean(),
               jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *trees[-k:]))


def test_lawa_trajectory_matches_plans():
  trees = {s: t for s, t in zip(range(10, 110, 10), _trees(10, seed=5))}
  out = list(A.lawa_trajectory(trees.__getitem__, sorted(trees), 3, recompute_every=4))
  assert [(s, n) for s, n, _ in out][:3] == [(10, 1), (20, 2), (30, 3)]
  for step, _, mean in out[2:]:
    plan = A.plan_lawa(sorted(trees), 3, end=step)
    ref = A.average(trees.__getitem__, plan)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), mean, ref)
