"""In-training averaging transforms: hand-computed values, jit, vmap, bf16, spec parsing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost import averaging as A

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def _trajectory(n, shape=(3,), dtype=jnp.float32, seed=0):
  """[n] parameter trees theta_s (s = 1..n) with distinct random values."""
  rng = np.random.default_rng(seed)
  return [{"w": jnp.asarray(rng.normal(size=shape), dtype),
           "b": {"c": jnp.asarray(rng.normal(size=(2,)), dtype)}} for _ in range(n)]


def _run(t, traj, variant):
  update = variant(t.update)
  state = t.init(traj[0])
  for p in traj:
    state = update(p, state)
  return variant(t.result)(state, traj[-1])


def _mean(trees, weights=None):
  w = np.ones(len(trees)) if weights is None else np.asarray(weights, np.float64)
  w = w / w.sum()
  return jax.tree.map(lambda *xs: sum(wi * np.asarray(x, np.float64) for wi, x in zip(w, xs)), *trees)


def _close(a, b, **kw):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64), y, **kw), a, b)


@VARIANTS
def test_lawa_is_mean_of_latest_k_at_spacing(variant):
  traj = _trajectory(11)
  # Snapshots at steps 3, 6, 9; the 2 latest are steps 6 and 9.
  out = _run(A.lawa(2, every=3), traj, variant)
  _close(out, _mean([traj[5], traj[8]]), rtol=1e-5, atol=1e-6)


@VARIANTS
def test_lawa_window_not_full_divides_by_count(variant):
  traj = _trajectory(5)
  out = _run(A.lawa(5, every=2), traj, variant)  # snapshots at 2 and 4 only
  _close(out, _mean([traj[1], traj[3]]), rtol=1e-6, atol=1e-6)


def test_lawa_sliding_window_equals_recompute():
  traj = _trajectory(200, shape=(16,), seed=1)
  t_fast = A.lawa(5, every=2, recompute_every=10 ** 6)  # O(1) add/subtract only
  t_ref = A.lawa(5, every=2, recompute_every=1)         # recomputed from the buffer every time
  s_fast, s_ref = t_fast.init(traj[0]), t_ref.init(traj[0])
  u_fast, u_ref = jax.jit(t_fast.update), jax.jit(t_ref.update)
  for i, p in enumerate(traj, 1):
    s_fast, s_ref = u_fast(p, s_fast), u_ref(p, s_ref)
    if i % 37 == 0 or i == len(traj):
      _close(t_fast.result(s_fast, p), jax.tree.map(np.asarray, t_ref.result(s_ref, p)),
             rtol=1e-5, atol=1e-6)
  _close(t_fast.result(s_fast, traj[-1]), _mean([traj[s - 1] for s in range(192, 201, 2)]),
         rtol=1e-5, atol=1e-6)


@VARIANTS
def test_ema_debiased_hand_computed(variant):
  traj = [{"x": jnp.float32(v)} for v in (1.0, 2.0, 4.0)]
  out = _run(A.ema(0.5), traj, variant)
  # zero start: m = 0.5, 1.25, 2.625; mass = 0.5, 0.75, 0.875.
  np.testing.assert_allclose(out["x"], 2.625 / 0.875, rtol=1e-6)


@VARIANTS
def test_ema_not_debiased_starts_at_init_params(variant):
  traj = [{"x": jnp.float32(v)} for v in (1.0, 2.0, 4.0)]
  out = _run(A.ema(0.5, debias=False), traj, variant)
  np.testing.assert_allclose(out["x"], 0.5 * (0.5 * (0.5 * 1 + 0.5) + 1.0) + 2.0, rtol=1e-6)


@VARIANTS
def test_ema_warmup_and_spacing(variant):
  traj = [{"x": jnp.float32(v)} for v in range(1, 7)]
  out = _run(A.ema(0.9, every=2, warmup=3.0), traj, variant)
  # snapshots at steps 2, 4, 6 (values 2, 4, 6) with d_n = min(0.9, (1 + n) / (3 + n)), n = 1..3.
  m, mass = 0.0, 0.0
  for n, v in zip((1, 2, 3), (2.0, 4.0, 6.0)):
    d = min(0.9, (1 + n) / (3 + n))
    m, mass = d * m + (1 - d) * v, d * mass + (1 - d)
  np.testing.assert_allclose(out["x"], m / mass, rtol=1e-6)


@VARIANTS
def test_swa_from_start(variant):
  traj = _trajectory(20)
  out = _run(A.swa(start=8, every=4), traj, variant)  # steps 8, 12, 16, 20
  _close(out, _mean([traj[s - 1] for s in (8, 12, 16, 20)]), rtol=1e-5, atol=1e-6)


@VARIANTS
def test_power_ema_matches_its_profile(variant):
  traj = _trajectory(30)
  g = A.sigma_rel_to_gamma(0.1)
  out = _run(A.power_ema(0.1), traj, variant)
  _close(out, _mean(traj, A.power_profile(30, g)), rtol=1e-5, atol=1e-6)


def test_result_before_first_snapshot_is_params():
  p = {"x": jnp.arange(3.0)}
  for t in (A.lawa(3, every=5), A.ema(0.9, every=5), A.swa(start=4), A.power_ema(0.05)):
    np.testing.assert_array_equal(t.result(t.init(p), p)["x"], p["x"])


def test_bf16_parameters_accumulate_in_fp32():
  # 1 + 2^-9 is not representable in bfloat16 sums of the form 256 + small; the fp32 accumulator
  # keeps small contributions that a bf16 running sum would drop.
  n = 300
  traj = [{"x": jnp.full((4,), 1.0 + (i % 2) * 2 ** -7, jnp.bfloat16)} for i in range(n)]
  for t in (A.lawa(n, every=1), A.swa(), A.ema(0.999)):
    state = t.init(traj[0])
    acc_leaves = [l for l in jax.tree.leaves(state) if l.ndim >= 1 and l.shape[-1] == 4]
    assert any(l.dtype == jnp.float32 for l in acc_leaves)
    update = jax.jit(t.update)
    for p in traj:
      state = update(p, state)
    out = t.result(state, traj[-1])
    assert out["x"].dtype == jnp.bfloat16
  lawa = A.lawa(n, every=1)
  state = lawa.init(traj[0])
  update = jax.jit(lawa.update)
  for p in traj:
    state = update(p, state)
  np.testing.assert_allclose(np.asarray(state.total["x"]) / n, 1.0 + 2 ** -8, rtol=1e-6)
  naive = jnp.bfloat16(0)
  for p in traj:
    naive = naive + p["x"][0]
  assert abs(float(naive) / n - (1 + 2 ** -8)) > 1e-3  # what a bf16 sum would give


@pytest.mark.parametrize("name", ["lawa", "ema", "swa", "power_ema"])
def test_vmap_over_runs_equals_separate_runs(name):
  make = {"lawa": lambda: A.lawa(3, every=2), "ema": lambda: A.ema(0.8, warmup=4.0),
          "swa": lambda: A.swa(start=2), "power_ema": lambda: A.power_ema(0.1)}[name]
  t = make()
  runs = [_trajectory(9, seed=s) for s in range(3)]
  stacked = [jax.tree.map(lambda *xs: jnp.stack(xs), *(r[i] for r in runs)) for i in range(9)]
  update = jax.jit(jax.vmap(t.update))
  state = jax.vmap(t.init)(stacked[0])
  for p in stacked:
    state = update(p, state)
  out = jax.jit(jax.vmap(t.result))(state, stacked[-1])
  for r, run in enumerate(runs):
    single = _run(t, run, jax.jit)
    _close(jax.tree.map(lambda x: x[r], out), jax.tree.map(np.asarray, single), rtol=1e-6, atol=1e-7)


def test_transform_inside_scan_compiles_once():
  t = A.named(lawa=A.lawa(3, every=2), ema=A.ema(0.9))
  traces = []

  def body(state, p):
    traces.append(1)
    return t.update(p, state), None

  traj = jnp.arange(12.0)[:, None] * jnp.ones((12, 2))
  state, _ = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(t.init(traj[0]), traj)
  out = t.result(state, traj[-1])
  np.testing.assert_allclose(out["lawa"], [9.0, 9.0])  # steps 8, 10, 12 hold values 7, 9, 11
  assert len(traces) == 1


def test_parse_spec_and_errors():
  t = A.parse_spec("lawa:k=5,every=50")
  s = t.init({"x": jnp.zeros(2)})
  assert s.buffer["x"].shape == (5, 2)
  named = A.parse_specs("lawa:k=5,every=50; ema:decay=0.99,debias=false ;power_ema:sigma_rel=0.05,as=ph")
  state = named.init({"x": jnp.zeros(2)})
  assert sorted(state) == ["ema_decay0.99_debiasFalse", "lawa_k5_every50", "ph"]
  with pytest.raises(ValueError, match="unknown averaging method 'lawaa'"):
    A.parse_spec("lawaa:k=5")
  with pytest.raises(ValueError, match=r"unknown key\(s\) \['kk'\]"):
    A.parse_spec("lawa:kk=5")
  with pytest.raises(ValueError, match="expected key=value"):
    A.parse_spec("ema:0.9")
  with pytest.raises(ValueError, match="decay must be in"):
    A.parse_spec("ema:decay=1.5")
  with pytest.raises(ValueError, match="share the name"):
    A.parse_specs("ema:decay=0.9;ema:decay=0.9")


def test_tracker_for_the_run_loop():
  p = {"x": jnp.zeros(2)}
  tracker = A.Tracker("lawa:k=2,every=1;ema:decay=0.5,as=fast", p)
  for v in (1.0, 2.0, 3.0):
    tracker.update({"x": jnp.full(2, v)})
  out = tracker.results({"x": jnp.full(2, 3.0)})
  np.testing.assert_allclose(out["lawa_k2_every1"]["x"], 2.5)
  ev = tracker.evaluate(lambda q: {"score": float(q["x"][0]), "other": 0.0},
                        {"x": jnp.full(2, 3.0)}, keys=("score",))
  assert sorted(ev) == ["avg/fast/score", "avg/lawa_k2_every1/score"]
  np.testing.assert_allclose(ev["avg/lawa_k2_every1/score"], 2.5)
