"""Orbax checkpoints of training runs: asynchronous, atomic, keep the last N plus the best.

A checkpoint holds the whole train state pytree (parameters, optimizer state, PRNG key data,
step, data cursor) and a JSON item with the run config and the step's metrics. Orbax writes to a
temporary directory and renames it on completion, so a crash never leaves a checkpoint that
``latest_step`` would return half-written.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

_pp = ocp.checkpoint_managers.preservation_policy


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for one run directory.

  keep_last: number of most recent checkpoints kept; best_metric (with best_mode "max" or
  "min"): additionally keep the single best checkpoint by that metric.
  """

  def __init__(self, directory: str, *, keep_last: int = 2, best_metric: str | None = None,
               best_mode: str = "max", async_save: bool = True):
    if best_mode not in ("max", "min"):
      raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
    self.directory = os.path.abspath(directory)
    self.best_metric = best_metric
    policies = [_pp.LatestN(n=keep_last)]
    if best_metric is not None:
      policies.append(_pp.BestN(get_metric_fn=lambda m: m[best_metric], reverse=best_mode == "min",
                                n=1, keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=_pp.AnyPreservationPolicy(policies),
        enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, meta: dict, metrics: dict | None = None) -> None:
    """Start saving ``state`` (a pytree of arrays) and ``meta`` (JSON-able) at ``step``.

    The state is stored as the flat list of its leaves; ``restore`` rebuilds the tree from a
    template, so any pytree (NNX states, optax states) round-trips without orbax needing to
    understand its node types.
    """
    metrics = {k: float(v) for k, v in (metrics or {}).items()}
    if self.best_metric is not None and self.best_metric not in metrics:
      metrics = None  # a step without the metric is kept by recency only
    leaves = {f"{i:05d}": x for i, x in enumerate(jax.tree.leaves(state))}
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(leaves), meta=ocp.args.JsonSave(meta)), metrics=metrics)

  def restore(self, step: int | None, like: Any) -> tuple[Any, dict]:
    """Restore ``(state, meta)`` at ``step`` (latest if None) with the structure of ``like``."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    leaves, treedef = jax.tree.flatten(like)
    abstract = {f"{i:05d}": ocp.utils.to_shape_dtype_struct(x) for i, x in enumerate(leaves)}
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    restored = [out["state"][f"{i:05d}"] for i in range(len(leaves))]
    return jax.tree.unflatten(treedef, restored), out["meta"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def save_params(directory: str, params: Any) -> None:
  """Synchronously save a parameter pytree (e.g. the cached SFT policy) to ``directory``."""
  leaves = {f"{i:05d}": x for i, x in enumerate(jax.tree.leaves(params))}
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.abspath(directory), leaves, force=True)


def load_params(directory: str, like: Any) -> Any:
  """Load a parameter pytree saved by ``save_params`` with the structure of ``like``."""
  leaves, treedef = jax.tree.flatten(like)
  abstract = {f"{i:05d}": ocp.utils.to_shape_dtype_struct(x) for i, x in enumerate(leaves)}
  with ocp.StandardCheckpointer() as ckptr:
    out = ckptr.restore(os.path.abspath(directory), abstract)
  return jax.tree.unflatten(treedef, [out[f"{i:05d}"] for i in range(len(leaves))])


def tree_checksum(tree: Any) -> float:
  """A cheap float64 fingerprint of a pytree's values (sum of |x| weighted by position)."""
  total = 0.0
  for i, leaf in enumerate(jax.tree.leaves(tree)):
    x = np.asarray(jax.device_get(leaf), np.float64).ravel()
    total += float(np.sum(np.abs(x) * (1 + (np.arange(x.size) % 7)))) * (i + 1)
  return total
