"""Dynamics data: solvers, systems (reversibility, determinism), tfds datasets, validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlpost.dynamics import data, solvers, systems

# Solvers.

def test_dealiased_products_are_exact_for_band_limited_functions():
  n = 32
  x = np.arange(n) * 2 * np.pi / n
  u, v = np.sin(3 * x) + np.cos(7 * x), np.cos(5 * x) - 0.5 * np.sin(8 * x)
  p = solvers._truncate_1d(solvers._pad_1d(solvers.to_fourier(u, 1), n)
                           * solvers._pad_1d(solvers.to_fourier(v, 1), n), n)
  np.testing.assert_allclose(solvers.to_physical(p, n, 1), u * v, atol=1e-12)
  xx, yy = np.meshgrid(x, x)  # xx varies along columns (x), yy along rows (y)
  a = np.sin(3 * xx) + np.cos(5 * yy) + np.sin(7 * xx - 6 * yy)
  b = np.cos(4 * xx + 2 * yy) + np.sin(8 * yy + 8 * xx)
  p2 = solvers._truncate_2d(solvers._pad_2d(solvers.to_fourier(a, 2), n)
                            * solvers._pad_2d(solvers.to_fourier(b, 2), n), n)
  np.testing.assert_allclose(solvers.to_physical(p2, n, 2), a * b, atol=1e-12)


def test_velocity_from_vorticity():
  n = 16
  x = np.arange(n) * 2 * np.pi / n
  xx, yy = np.meshgrid(x, x)
  w = np.sin(2 * xx) * np.sin(3 * yy)  # stream function w / 13
  u, v = solvers.velocity_2d(solvers.to_fourier(w, 2), n, 2 * np.pi)
  np.testing.assert_allclose(u, 3 * np.sin(2 * xx) * np.cos(3 * yy) / 13, atol=1e-14)
  np.testing.assert_allclose(v, -2 * np.cos(2 * xx) * np.sin(3 * yy) / 13, atol=1e-14)


@pytest.mark.parametrize("step", [solvers.if_rk4, solvers.etdrk4])
def test_kdv_soliton_moves_at_its_speed_and_conserves(step):
  n, length, c, x0 = 64, 40.0, 1.0, 10.0
  x = np.arange(n) * length / n

  def soliton(t):
    d = (x - x0 - c * t + length / 2) % length - length / 2
    return 0.5 * c / np.cosh(0.5 * np.sqrt(c) * d) ** 2

  lin, nonlin = solvers.kdv_terms(n, length)
  u = solvers.to_physical(
      solvers.run(step(lin, nonlin, 0.5 / 32), solvers.to_fourier(soliton(0)[None], 1), 40, 32),
      n, 1)[0]
  exact = soliton(20.0)
  assert np.linalg.norm(u[-1] - exact) / np.linalg.norm(exact) < 1e-4
  energy = (u ** 2).sum(-1)
  np.testing.assert_allclose(energy, energy[0], rtol=1e-6)
  np.testing.assert_allclose(u.sum(-1), u[0].sum(), rtol=1e-10)


def test_ns2d_inviscid_conserves_energy_and_enstrophy():
  ns = dataclasses.replace(systems.get_system("ns2d"), viscosity=0.0)
  w = ns.simulate(2, 0, num_frames=9).astype(np.float64)[..., 0]
  enstrophy = (w ** 2).sum((-1, -2))
  np.testing.assert_allclose(enstrophy, enstrophy[:, :1] * np.ones_like(enstrophy), rtol=1e-4)
  u, v = solvers.velocity_2d(solvers.to_fourier(w, 2), 32, 2 * np.pi)
  energy = (u ** 2 + v ** 2).sum((-1, -2))
  np.testing.assert_allclose(energy, energy[:, :1] * np.ones_like(energy), rtol=1e-5)


def test_ks_matches_exponax():
  # exponax's ETDRK4 (order 4) in float32 with 2/3-rule dealiasing against this float64
  # ETDRK4 with 3/2-rule dealiasing, from the same state on the attractor: they agree to about
  # 1.4e-3 (the two dealiasing rules differ in the highest modes), for as long as chaos allows.
  jax = pytest.importorskip("jax")
  exponax = pytest.importorskip("exponax")
  ks = systems.get_system("ks1d")
  x0 = ks.initial_state(2, 0)
  ours = ks.advance(x0, 5)[..., 0]
  stepper = exponax.stepper.KuramotoSivashinskyConservative(
      1, ks.domain_length, ks.spatial_shape[0], ks.dt / ks.substeps, order=4)
  frame = jax.jit(jax.vmap(lambda u: jax.lax.fori_loop(0, ks.substeps, lambda i, v: stepper(v),
                                                       u)))
  u = jax.numpy.asarray(x0[..., 0][:, None, :], jax.numpy.float32)
  for t in range(1, 6):
    u = frame(u)
    err = np.linalg.norm(np.asarray(u)[:, 0] - ours[:, t]) / np.linalg.norm(ours[:, t])
    assert err < 5e-3, (t, err)


# Systems.

def test_registry_and_descriptions():
  assert systems.list_systems() == ["kdv1d", "ks1d", "ns2d"]
  with pytest.raises(ValueError, match=r"unknown system 'kdv'.*kdv1d.*ks1d.*ns2d"):
    systems.get_system("kdv")
  with pytest.raises(ValueError, match=r"unknown system 'ks'.*\['kdv1d', 'ks1d', 'ns2d'\]"):
    systems.simulate("ks", 2, 0)
  with pytest.raises(ValueError, match="unknown system"):
    systems.reversibility_error("ns", 2, 0)
  for name in systems.list_systems():
    s = systems.get_system(name)
    assert s.name == name and s.num_fields == len(s.field_names) == 1
    assert s.ndim == len(s.spatial_shape) and s.num_frames == 40
    assert "backward" in s.description and s.ood_description
  assert systems.get_system("kdv1d").reversible and systems.get_system("ns2d").reversible
  ks = systems.get_system("ks1d")
  assert not ks.reversible and "ill posed" in ks.description
  assert systems.get_system("ns2d").spatial_shape == (32, 32)
  assert systems.get_system("kdv1d").spatial_shape == (64,)
  with pytest.raises(dataclasses.FrozenInstanceError):
    ks.dt = 2.0


@pytest.mark.parametrize("name", ["kdv1d", "ks1d", "ns2d"])
def test_simulate_shapes_determinism_and_prefix(name):
  s = systems.get_system(name)
  x = s.simulate(3, 7, num_frames=4)
  assert x.shape == (3, 4, *s.spatial_shape, 1) and x.dtype == np.float32
  assert np.all(np.isfinite(x)) and np.abs(x).max() > 0.1
  np.testing.assert_array_equal(x, s.simulate(3, 7, num_frames=4))
  np.testing.assert_allclose(s.simulate(2, 7, num_frames=4), x[:2], rtol=1e-6, atol=1e-6)
  assert not np.allclose(x, s.simulate(3, 8, num_frames=4))
  ood = s.simulate(3, 7, ood=True, num_frames=4)
  assert ood.shape == x.shape and np.all(np.isfinite(ood)) and not np.allclose(ood, x)
  # Frames change by a meaningful fraction (no stalled or frozen trajectories).
  change = np.linalg.norm((x[:, 1:] - x[:, :-1]).reshape(3, 3, -1), axis=-1)
  assert np.all(change / np.linalg.norm(x[:, :-1].reshape(3, 3, -1), axis=-1) > 1e-3)


def test_simulate_rejects_bad_arguments():
  s = systems.get_system("kdv1d")
  for n in (0, -1, 2.5, True, None):
    with pytest.raises(ValueError, match="n must be a positive integer"):
      s.simulate(n, 0)
  with pytest.raises(ValueError, match="seed"):
    s.simulate(2, -1)
  with pytest.raises(ValueError, match="num_frames"):
    s.simulate(2, 0, num_frames=0)
  with pytest.raises(ValueError, match="states must be"):
    s.advance(np.zeros((2, 32, 1)), 1)
  with pytest.raises(ValueError, match="frames must be"):
    s.advance(np.zeros((2, 64, 1)), -1)
  with pytest.raises(ValueError, match="frames must be"):
    systems.reversibility_error("kdv1d", 0, 0)


def test_kdv_reversible():
  assert systems.reversibility_error("kdv1d", 16, 0) < 1e-4
  assert systems.reversibility_error("kdv1d", 16, 0, ood=True) < 1e-4


def test_ks_backward_is_ill_posed():
  # Documents ill-posedness: one frame backward already overflows (mode k grows like
  # exp((k^4 - k^2) t)), so the round trip cannot return.
  assert systems.reversibility_error("ks1d", 1, 0) > 1.0


def test_ns2d_reversible_over_a_few_frames():
  assert systems.reversibility_error("ns2d", 4, 0) < 1e-3


def test_ks_trajectories_are_chaotic_not_settled():
  ks = systems.get_system("ks1d")
  x0 = ks.initial_state(4, 1)
  rng = np.random.default_rng(0)
  bump = 1e-7 * solvers.project(rng.normal(size=x0.shape[:-1]), 1)[..., None]
  a, b = ks.advance(x0, 20), ks.advance(x0 + bump, 20)
  growth = np.linalg.norm((a[:, -1] - b[:, -1]).reshape(4, -1), axis=-1) / np.linalg.norm(
      bump.reshape(4, -1), axis=-1)
  assert np.median(growth) > 2.0  # nearby states separate on the attractor


def test_kdv_initial_solitons_are_separated():
  kdv = systems.get_system("kdv1d")
  # The tallest single soliton (or bump): two started on top of each other would be about twice it.
  tallest = max(kdv.speed_range[1] / 2, kdv.ood_amplitude_range[1])
  for ood in (False, True):
    x0 = kdv.initial_state(64, 0, ood)[..., 0]
    assert 0.5 * tallest < x0.max() < 1.05 * tallest
  with pytest.raises(ValueError, match="may not fit"):
    systems._separated_positions(np.random.default_rng(0), 3, 10.0, 4.0)


# Datasets.

SMALL = {"num_train": 2, "num_val": 1, "num_test": 1, "num_ood": 1, "num_frames": 3}


def test_load_builds_once_and_reads_back(tmp_path, monkeypatch):
  out = data.load_all("kdv1d", data_dir=tmp_path, **SMALL)
  assert set(out) == set(data.SPLITS)
  assert out["train"].shape == (2, 3, 64, 1) and out["ood"].shape == (1, 3, 64, 1)
  kdv = systems.get_system("kdv1d")
  for split, x in out.items():
    assert x.dtype == np.float32
    expected = kdv.simulate(x.shape[0], data.split_seed(0, split), ood=split == "ood",
                            num_frames=3)
    np.testing.assert_array_equal(x, expected)
  # A second call reads from disk: simulating again would fail.
  monkeypatch.setattr(systems.System, "simulate", lambda *a, **k: 1 / 0)
  np.testing.assert_array_equal(data.load("kdv1d", "test", data_dir=tmp_path, **SMALL),
                                out["test"])
  assert len(list(tmp_path.glob("dynamics_trajectories/kdv1d_*"))) == 1


def test_load_2d_and_configs_are_keyed(tmp_path):
  x = data.load("ns2d", "validation", data_dir=tmp_path, **SMALL)
  assert x.shape == (1, 3, 32, 32, 1)
  y = data.load("ns2d", "validation", data_dir=tmp_path, seed=1, **SMALL)
  assert not np.allclose(x, y)
  assert len(list(tmp_path.glob("dynamics_trajectories/ns2d_*"))) == 2


def test_load_rejects_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match=r"unknown system 'burgers'.*\['kdv1d', 'ks1d', 'ns2d'\]"):
    data.load("burgers", "train", data_dir=tmp_path, **SMALL)
  with pytest.raises(ValueError, match=r"unknown split 'valid'.*validation"):
    data.load("kdv1d", "valid", data_dir=tmp_path, **SMALL)
  for key in ("num_train", "num_val", "num_test", "num_ood", "num_frames"):
    for bad in (0, -3, 1.5):
      with pytest.raises(ValueError, match=key):
        data.load("kdv1d", "train", data_dir=tmp_path, **{**SMALL, key: bad})
  with pytest.raises(ValueError, match="num_frames must be >= 2"):
    data.load("kdv1d", "train", data_dir=tmp_path, **{**SMALL, "num_frames": 1})
  with pytest.raises(ValueError, match="seed"):
    data.load_all("kdv1d", data_dir=tmp_path, seed=-1, **SMALL)
  assert not list(tmp_path.glob("dynamics_trajectories/*"))


def test_split_seeds_are_distinct():
  seeds = {data.split_seed(s, split) for s in range(3) for split in data.SPLITS}
  assert len(seeds) == 12


# Validation.

def test_check_trajectories():
  x = np.random.default_rng(0).normal(size=(4, 5, 8, 2))
  y = data.check_trajectories(x)
  assert y.dtype == np.float32 and y.shape == x.shape
  assert data.check_trajectories(np.zeros((1, 2, 3, 3, 1)), spatial_rank=2).shape == (1, 2, 3, 3, 1)
  with pytest.raises(ValueError, match=r"x: expected \[N, T, \*S, F\].*rank 3"):
    data.check_trajectories(np.zeros((4, 5, 8)), "x")
  with pytest.raises(ValueError, match="2 spatial axes"):
    data.check_trajectories(x, spatial_rank=2)
  with pytest.raises(ValueError, match="expected 3 fields"):
    data.check_trajectories(x, num_fields=3)
  with pytest.raises(ValueError, match="empty axis"):
    data.check_trajectories(np.zeros((0, 5, 8, 1)))
  with pytest.raises(ValueError, match="real numeric"):
    data.check_trajectories(x.astype(np.complex64))
  bad = x.copy()
  bad[2, 3, 1, 1] = np.nan
  bad[3, 0, 0, 0] = np.inf
  with pytest.raises(ValueError, match=r"trajectory 2 contains NaN \(first at frame 3, field 1\); "
                                       r"2 of 4"):
    data.check_trajectories(bad)
  bad[2, 3, 1, 1] = 0.0
  with pytest.raises(ValueError, match=r"trajectory 3 contains inf"):
    data.check_trajectories(bad)


def test_check_trajectories_per_field_mapping():
  rng = np.random.default_rng(0)
  u, v = rng.normal(size=(2, 3, 4, 4)), rng.normal(size=(2, 3, 4, 4))
  np.testing.assert_array_equal(data.check_trajectories({"u": u, "v": v}),
                                np.stack([u, v], -1).astype(np.float32))
  with pytest.raises(ValueError, match=r"field 'v' has shape \(2, 3, 4, 5\) but field 'u' has "
                                       r"\(2, 3, 4, 4\)"):
    data.check_trajectories({"u": u, "v": np.zeros((2, 3, 4, 5))})
  v[1, 2, 0, 0] = np.nan
  with pytest.raises(ValueError, match=r"trajectory 1 contains NaN \(first at frame 2, field 1 "
                                       r"\('v'\)\)"):
    data.check_trajectories({"u": u, "v": v})
  with pytest.raises(ValueError, match="no fields"):
    data.check_trajectories({})


def test_check_depth():
  assert data.check_depth(39, 40) == 39 and data.check_depth(np.int64(1), 2) == 1
  with pytest.raises(ValueError, match=r"depth 40 is larger than the trajectory: 40 frames allow "
                                       r"depths 1..39"):
    data.check_depth(40, 40)
  for bad in (0, -1):
    with pytest.raises(ValueError, match=">= 1"):
      data.check_depth(bad, 40)
  for bad in (True, 2.0, "3"):
    with pytest.raises(ValueError, match="integer"):
      data.check_depth(bad, 40)
