"""One (system, seed, model kind) unit: train a stepper, roll it out, keep the per-rollout numbers.

Shape legend: N trajectories, T frames, S spatial axes, F fields, P start times per trajectory,
B = N * P rollouts (trajectory-major: rollout ``n * P + p`` starts trajectory n at start p),
K depths, D = max depth, M stochastic samples.

A unit stores raw per-rollout arrays only (errors, discrepancies, dispersions); every statistic is
computed later from them (``analysis.py``), so changing the analysis never retrains a model. The
experiment's ``harness.Unit`` caches a finished unit (arrays as ``.npz``, the rest as ``.json``)
under the digest of its plain-data spec (``SystemPlan.unit_spec``).

Arrays of the bidirectional unit (``kind="bidir"``):
  test_E, test_C, test_C_latent    [B, K]  forward error E_i (decoded, relative L2 pooled over
                                           space and fields) and round-trip discrepancy C_i in
                                           decoded space and in the diffusion space (the latent
                                           space in latent mode, the normalised fields otherwise)
  test_disp, test_disp_norm        [B, K]  spread of M stochastic forward samples, raw and
                                           normalised by the ensemble mean's norm
  train_E, train_C, train_C_latent [B', K] the same on training trajectories (calibrator fit)
  ood_E, ood_C, ood_C_latent, ood_disp, ood_disp_norm  on OOD trajectories
  test_fwd_err [B, D]    forward error at every depth 1..D
  test_bwd_err [B, D]    backward rollout from the true state at start + D: column j-1 is the
                         relative L2 to the true state j frames earlier (the inverse problem:
                         recover x_0 from the true x_j)
  test_persist [B, D]    the same for the trivial inverse estimate "x_0 = x_j"
  test_fwd_persist [B, D]  the trivial forward prediction "x_i = x_0": relative L2 to the true
                         x_i (column i-1), the floor a model must beat to have learned anything
Specialists store ``test_fwd_err`` or ``test_bwd_err``; the undertrained model ``test_E`` and
``test_C``.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from experiments.roundtrip import config as cfg_lib
from rlpost.dynamics import rollout as rollout_lib
from rlpost.dynamics import train as train_lib
from rlpost.eval import trust


def start_times(num_frames: int, max_depth: int, stride: int) -> np.ndarray:
  """Start frames 0, stride, 2 stride, ... with start + max_depth <= num_frames - 1: int [P]."""
  last = num_frames - 1 - max_depth
  if last < 0:
    raise ValueError(f"depth {max_depth} does not fit in trajectories of {num_frames} frames")
  return np.arange(0, last + 1, stride)


def windows(traj: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  """Every trajectory from every start: traj [N, T, *S, F] -> [N * P, length + 1, *S, F]."""
  win = np.stack([traj[:, s:s + length + 1] for s in starts], axis=1)  # [N, P, L+1, ...]
  return win.reshape((-1,) + win.shape[2:])


def cycled_windows(traj: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  """One window per trajectory, trajectory n starting at ``starts[n % P]``: [N, length + 1, ...]."""
  return np.stack([traj[n, s:s + length + 1]
                   for n, s in enumerate(np.resize(starts, traj.shape[0]))])


def _take(traj: np.ndarray, n: int | None) -> np.ndarray:
  return traj if n is None else traj[:n]


def unit_data(plan: cfg_lib.SystemPlan, data: dict[str, np.ndarray]) -> dict[str, Any]:
  """The windows a unit rolls out: truth paths [B, D+1, *S, F] for train / test / OOD."""
  d = plan.max_depth
  t = data["test"].shape[1]
  starts = start_times(t, d, plan.start_stride)[:plan.max_starts]
  ood_starts = starts[::plan.ood_start_every]
  return {
      "starts": starts,
      "ood_starts": ood_starts,
      "train": cycled_windows(_take(data["train"], plan.num_train_traj), starts, d),
      "test": windows(_take(data["test"], plan.num_test_traj), starts, d),
      "ood": windows(_take(data["ood"], plan.num_ood_traj), ood_starts, d),
  }


def _round_trip_arrays(stepper, truth: np.ndarray, depths: tuple[int, ...], key: jax.Array,
                       spatial_dims: int) -> dict[str, np.ndarray]:
  """E_i, C_i (decoded) and C_i (diffusion space) of rollouts from truth[:, 0]: each [B, K]."""
  rt = rollout_lib.round_trip(stepper, truth[:, 0], depths, key)
  err, _ = trust.rollout_error(np.asarray(rt.forward.x), truth[:, :max(depths) + 1], spatial_dims)
  idx = list(depths)
  return {"E": err[:, idx], "C": np.asarray(rt.c_field, np.float64),
          "C_latent": np.asarray(rt.c_latent, np.float64), "fwd_err": err[:, 1:]}


def _dispersion_arrays(stepper, x0: np.ndarray, depths: tuple[int, ...], key: jax.Array,
                       num_samples: int) -> dict[str, np.ndarray]:
  """Spread of M stochastic forward rollouts at each depth: raw and normalised, each [B, K]."""
  paths = rollout_lib.sample_rollouts(stepper, x0, +1, max(depths), key, num_samples)
  xs = np.asarray(paths.x)  # [M, B, D+1, *S, F]
  raw, norm = zip(*(trust.dispersion(xs[:, :, d]) for d in depths))
  return {"disp": np.stack(raw, 1), "disp_norm": np.stack(norm, 1)}


def _backward_errors(stepper, truth: np.ndarray, key: jax.Array, spatial_dims: int) -> np.ndarray:
  """Backward rollout from the true end state truth[:, D]: error of step j against truth[:, D-j],
  [B, D] (column j-1)."""
  d = truth.shape[1] - 1
  path = rollout_lib.rollout(stepper, truth[:, d], -1, d, key)
  err, _ = trust.rollout_error(np.asarray(path.x), truth[:, ::-1], spatial_dims)
  return err[:, 1:]


def persistence_errors(truth: np.ndarray, spatial_dims: int) -> np.ndarray:
  """The trivial inverse estimate x_{D-j} := x_D: relative L2 [B, D] (column j-1).

  Passing ``truth[:, ::-1]`` gives the trivial forward prediction x_i := x_0 instead (column
  i-1: relative L2 of x_0 to the true x_i).
  """
  rev = truth[:, ::-1]
  err, _ = trust.rollout_error(np.broadcast_to(rev[:, :1], rev.shape), rev, spatial_dims)
  return err[:, 1:]


def evaluate(kind: str, plan: cfg_lib.SystemPlan, model: tuple, windows_: dict[str, Any],
             key: jax.Array, spatial_dims: int) -> dict[str, np.ndarray]:
  """Every per-rollout array of one trained model (see the module docstring)."""
  graphdef, params, stats = model
  det = rollout_lib.make_stepper(graphdef, params, stats, plan.deterministic_sampler())
  keys = jax.random.split(key, 8)
  out: dict[str, np.ndarray] = {}
  test = windows_["test"]
  if kind in ("bidir", "under"):
    for split, k in (("test", keys[0]), ("train", keys[1]), ("ood", keys[2])):
      if kind == "under" and split != "test":
        continue
      arrays = _round_trip_arrays(det, windows_[split], plan.depths, k, spatial_dims)
      fwd = arrays.pop("fwd_err")
      if split == "test":
        out["test_fwd_err"] = fwd
      out.update({f"{split}_{name}": v for name, v in arrays.items()})
  if kind == "bidir":
    sto = rollout_lib.make_stepper(graphdef, params, stats, plan.stochastic_sampler())
    for split, k in (("test", keys[3]), ("ood", keys[4])):
      disp = _dispersion_arrays(sto, windows_[split][:, 0], plan.depths, k, plan.num_samples)
      out.update({f"{split}_{name}": v for name, v in disp.items()})
    out["test_bwd_err"] = _backward_errors(det, test, keys[5], spatial_dims)
    out["test_persist"] = persistence_errors(test, spatial_dims)
    out["test_fwd_persist"] = persistence_errors(test[:, ::-1], spatial_dims)
  if kind == "forward":
    path = rollout_lib.rollout(det, test[:, 0], +1, plan.max_depth, keys[0])
    err, _ = trust.rollout_error(np.asarray(path.x), test, spatial_dims)
    out["test_fwd_err"] = err[:, 1:]
  if kind == "backward":
    out["test_bwd_err"] = _backward_errors(det, test, keys[5], spatial_dims)
  return {k: finite(v) for k, v in out.items()}


# Stand-in for a diverged rollout's error or discrepancy (an overflow or NaN): the worst value.
DIVERGED = 1e30


def finite(x) -> np.ndarray:
  """float64 copy of x with NaN and inf replaced by ``DIVERGED``, so a rollout that blew up
  ranks as the worst instead of breaking the rank statistics."""
  return np.nan_to_num(np.asarray(x, np.float64), nan=DIVERGED, posinf=DIVERGED,
                       neginf=DIVERGED)


def run_unit(kind: str, plan: cfg_lib.SystemPlan, data: dict[str, np.ndarray], seed: int
             ) -> dict[str, Any]:
  """Train one model of ``kind`` with ``seed`` (init and training noise) and evaluate it.

  Returns the per-rollout arrays (see the module docstring) and, beside them, JSON metadata:
  the loss history, parameter count, timings, diverged entries and the window counts.
  """
  spatial_dims = data["train"].ndim - 3
  key = jax.random.key(seed)
  t0 = time.perf_counter()
  graphdef, params, stats, hist = train_lib.train(plan.train_config(kind), data["train"], key)
  t1 = time.perf_counter()
  wins = unit_data(plan, data)
  arrays = evaluate(kind, plan, (graphdef, params, stats), wins, jax.random.fold_in(key, 1),
                    spatial_dims)
  t2 = time.perf_counter()
  diverged = {k: int(np.sum(v >= DIVERGED)) for k, v in arrays.items() if np.any(v >= DIVERGED)}
  return dict(arrays, kind=kind, system=plan.name, seed=seed, diverged=diverged,
              num_params=int(hist["num_params"]), loss_step=np.asarray(hist["step"]).tolist(),
              loss=np.asarray(hist["loss"]).tolist(), ae_loss=np.asarray(hist["ae_loss"]).tolist(),
              timing={"train": t1 - t0, "ae": float(hist["ae_seconds"]), "evaluate": t2 - t1},
              windows={"starts": len(wins["starts"]),
                       "test_traj": len(_take(data["test"], plan.num_test_traj)),
                       **{split: int(wins[split].shape[0]) for split in ("test", "train", "ood")}})
