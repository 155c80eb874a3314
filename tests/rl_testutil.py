"""A small RL fixture policy that learns, and the preconditions every comparison test asserts.

A comparison between two runs (resume, device counts, vmapped seeds, memory options) proves
nothing if nothing moved: with zero reward variance every advantage is 0, the gradient is 0, and
two runs agree whatever the implementation. The fixture is the character model on 1-2 digit
addition, SFT warm-started for 400 steps (about 5 s on 2 cores, cached per test module) to a
pass rate near one half, with 8 prompts x 4 rollouts per step: a group has zero reward variance
with probability ~2 * 0.5**4, so every step has mixed groups, a non-zero policy gradient and a
parameter update. ``assert_moved`` checks that on the metrics of the steps a test compares.
"""

from __future__ import annotations

import hashlib
import os

import jax
import numpy as np

from rlpost.train import rl

TINY_MODEL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def learning_config(dirs: dict, **kw) -> dict:
  """The fixture's RLConfig dict; ``dirs`` holds data_dir and cache_dir, ``kw`` overrides."""
  cfg = dict(task_spec=dict(min_digits=1, max_digits=2), num_train=200, num_test=40,
             model=TINY_MODEL, sft_steps=400, sft_lr=3e-3, sft_batch_size=32, num_prompts=8,
             group_size=4, steps=4, eval_every=2, eval_problems=8, eval_samples=4,
             eval_batch=32, checkpoint_every=2, **dirs)
  cfg.update(kw)
  return cfg


def learning_trainer(dirs: dict, **kw) -> rl.Trainer:
  return rl.make_train(learning_config(dirs, **kw), log=lambda s: None)


def assert_moved(metrics: dict, what: str = "") -> None:
  """The step had groups with mixed rewards and a non-zero gradient (a metrics dict of one
  step, values or 0-d arrays; per-seed arrays must all have moved)."""
  zv = np.asarray(metrics["zero_variance_groups"])
  gn = np.asarray(metrics["grad_norm"])
  assert np.all(zv < 1.0), f"{what}: every group had zero reward variance ({zv})"
  assert np.all(gn > 1e-3), f"{what}: the gradient is {gn}; nothing to compare"


def max_update_gap(a, b, start) -> tuple[float, float]:
  """(max |a - b|, max |b - start|) over the leaves of three parameter trees: how far two runs
  ended apart, against how far the reference run moved from ``start``."""
  gap = moved = 0.0
  for x, y, s in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(start)):
    x, y, s = (np.asarray(v, np.float64) for v in (x, y, s))
    gap = max(gap, float(np.max(np.abs(x - y))))
    moved = max(moved, float(np.max(np.abs(y - s))))
  return gap, moved


def tree_digest(root: str) -> dict:
  """{relative path: sha256 of the bytes} of every file under ``root``, and "dir" for every
  directory: equal before and after a command exactly when it changed nothing there."""
  out = {}
  for d, subdirs, names in os.walk(root):
    for n in subdirs:
      out[os.path.relpath(os.path.join(d, n), root)] = "dir"
    for n in names:
      path = os.path.join(d, n)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out
