"""Orbax checkpoints of training runs: asynchronous, atomic, verified, keep the last N plus best.

A checkpoint holds the whole train state pytree (parameters, optimizer state, PRNG key data,
step, data cursor) and a JSON item with the run config and the step's metrics. Orbax writes to a
temporary directory and renames it on completion, so a crash never leaves a checkpoint that
``latest_step`` would return half-written.

Integrity: every save also records a manifest in the JSON item (each leaf's shape, dtype and
CRC-32 of its bytes). ``restore`` checks the tree structure, shapes and dtypes against the run's
template before reading, then the checksums and finiteness of what it read, and raises
``CheckpointError`` naming the step and the leaf; a checkpoint without a manifest is refused.
``restore_latest`` walks back to the previous good checkpoint only when asked
(``fallback=True``), moving each damaged one aside (never deleting it); a checkpoint of another
run's shape (``CheckpointMismatch``) is never moved.

The on-disk layout (item names, flat leaf keys, manifest, the parameter-tree writer and reader)
is ``rlpost.checkpoint_format``'s; its public names are re-exported here.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from rlpost.checkpoint_format import (INTEGRITY_KEY, META_ITEM, STATE_ITEM, CheckpointError,
                                     abstract_dict, crc32_of, flat_dict, flat_key, host_copy,
                                     manifest, read_tree, write_tree)

__all__ = ["INTEGRITY_KEY", "CheckpointError", "CheckpointMismatch", "Checkpointer", "crc32_of", "host_copy",
           "load_params", "manifest", "save_params", "tree_checksum"]

_pp = ocp.checkpoint_managers.preservation_policy


class _NoMissingMetricWarning(logging.Filter):
  """Drops orbax's warning for a save without metrics: only evaluated steps carry the best
  metric, by design (the others are kept by recency)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "did not provide metrics" not in record.getMessage()


logging.getLogger("absl").addFilter(_NoMissingMetricWarning())


class CheckpointMismatch(CheckpointError):
  """A checkpoint whose structure, shapes or dtypes differ from this run's state: not damage,
  another run's shape (a changed model, optimizer or averaging config). ``resume_fallback``
  never moves such a checkpoint aside."""


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for one run directory.

  keep_last: number of most recent checkpoints kept; best_metric (with best_mode "max" or
  "min"): additionally keep the single best checkpoint by that metric. The metric is stored
  with each checkpoint that has it, so the best one survives restarts and extensions.
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
    # ``best_fn`` makes orbax write each step's metrics into its checkpoint (the preservation
    # policy above decides what is kept), so the best checkpoint is known again after a restart.
    options = ocp.CheckpointManagerOptions(
        preservation_policy=_pp.AnyPreservationPolicy(policies),
        best_fn=None if best_metric is None else (lambda m: m[best_metric]),
        best_mode=best_mode, max_to_keep=None,
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
    flat = jax.tree.leaves(state)
    meta = dict(meta, **{INTEGRITY_KEY: manifest(flat)})
    self.manager.save(step, args=ocp.args.Composite(**{
        STATE_ITEM: ocp.args.StandardSave(flat_dict(flat)),
        META_ITEM: ocp.args.JsonSave(meta)}), metrics=metrics)

  def restore(self, step: int | None, like: Any, *, verify: bool = True) -> tuple[Any, dict]:
    """Restore ``(state, meta)`` at ``step`` (latest if None) with the structure of ``like``.

    With ``verify`` (the default) the checkpoint's manifest is checked against ``like`` before
    reading and against the values read; any problem raises ``CheckpointError`` naming the step.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if step not in self.all_steps():
      raise CheckpointError(step, self.directory, f"no such step (have {self.all_steps()})")
    leaves, treedef = jax.tree.flatten(like)
    try:
      meta = self.manager.restore(step, args=ocp.args.Composite(
          **{META_ITEM: ocp.args.JsonRestore()}))[META_ITEM]
    except Exception as e:  # noqa: BLE001 - any read failure means an unusable checkpoint
      raise CheckpointError(step, self.directory, f"unreadable metadata ({e!r})") from e
    if not isinstance(meta, dict):
      raise CheckpointError(step, self.directory, "metadata is not a JSON object")
    expected = meta.get(INTEGRITY_KEY)
    if verify:
      if not isinstance(expected, list):
        raise CheckpointError(step, self.directory, "has no integrity manifest in its metadata "
                              "(every checkpoint rlpost writes has one): damaged, or not "
                              "written by rlpost")
      self._check_template(step, expected, leaves)
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(
          **{STATE_ITEM: ocp.args.StandardRestore(abstract_dict(leaves))}))
      restored = [out[STATE_ITEM][flat_key(i)] for i in range(len(leaves))]
    except Exception as e:  # noqa: BLE001
      raise CheckpointError(step, self.directory, f"cannot read the state ({e!r})") from e
    if verify:
      self._check_values(step, expected, restored)
    return jax.tree.unflatten(treedef, restored), meta

  def _check_template(self, step: int, expected: list, leaves: list) -> None:
    if len(expected) != len(leaves):
      raise CheckpointMismatch(step, self.directory, f"holds {len(expected)} arrays but this "
                               f"run's state has {len(leaves)} (a different model, optimizer or "
                               "config?)")
    for i, (e, x) in enumerate(zip(expected, leaves)):
      shape, dtype = list(np.shape(x)), str(np.dtype(x.dtype))
      if e["shape"] != shape or e["dtype"] != dtype:
        raise CheckpointMismatch(step, self.directory, f"array {flat_key(i)} is "
                                 f"{e['dtype']}{e['shape']} but this run expects {dtype}{shape}")

  def _check_values(self, step: int, expected: list | None, restored: list) -> None:
    for i, x in enumerate(restored):
      host = host_copy(x)
      if host is None:
        continue
      want = None if expected is None else expected[i]["crc32"]
      if want is not None and crc32_of(host) != want:
        raise CheckpointError(step, self.directory, f"array {flat_key(i)} fails its checksum "
                              f"(corrupted on disk)")
      if np.issubdtype(host.dtype, np.inexact) and not np.all(np.isfinite(host)):
        raise CheckpointError(step, self.directory,
                              f"array {flat_key(i)} holds non-finite values")

  def restore_latest(self, like: Any, *, fallback: bool = False,
                     log: Callable[[str], None] = print) -> tuple[int | None, Any, dict]:
    """``(step, state, meta)`` of the latest usable checkpoint; ``(None, None, {})`` if none.

    A bad latest checkpoint raises ``CheckpointError`` unless ``fallback``: then it is moved to
    ``<directory>.corrupt/<step>`` (kept for inspection) and the previous one is tried.
    """
    for step in sorted(self.all_steps(), reverse=True):
      try:
        state, meta = self.restore(step, like)
        return step, state, meta
      except CheckpointMismatch:
        raise  # a sound checkpoint of another run's shape: nothing to fall back from
      except CheckpointError as e:
        if not fallback:
          raise CheckpointError(step, self.directory, f"{str(e).split(': ', 1)[1]}; pass "
                                f"fallback=True (resume_fallback=true) to resume from the previous "
                                f"good checkpoint instead") from e
        self.quarantine(step)
        log(f"WARNING: {e}; moved it aside and trying the previous checkpoint")
    return None, None, {}

  def quarantine(self, step: int) -> str:
    """Move checkpoint ``step`` to ``<directory>.corrupt/<step>``; returns the new path."""
    self.manager.wait_until_finished()
    dest_root = self.directory.rstrip("/") + ".corrupt"
    dest = os.path.join(dest_root, str(step))
    if jax.process_index() == 0:  # one writer on shared storage
      os.makedirs(dest_root, exist_ok=True)
      if os.path.exists(dest):
        shutil.rmtree(dest)
      shutil.move(os.path.join(self.directory, str(step)), dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(f"rlpost-quarantine-{step}")
    self.manager.reload()
    return dest

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def save_params(directory: str, params: Any) -> None:
  """Synchronously and atomically save a parameter pytree (e.g. the cached SFT policy) to
  ``directory`` as a flat item (``rlpost.checkpoint_format``), replacing what is there."""
  write_tree(directory, params, overwrite=True)


def load_params(directory: str, like: Any) -> Any:
  """Load a parameter pytree saved by ``save_params`` with the structure of ``like``."""
  return read_tree(directory, like)


def tree_checksum(tree: Any) -> float:
  """A cheap float64 fingerprint of a pytree's values (sum of |x| weighted by position)."""
  total = 0.0
  for i, leaf in enumerate(jax.tree.leaves(tree)):
    x = np.asarray(jax.device_get(leaf), np.float64).ravel()
    total += float(np.sum(np.abs(x) * (1 + (np.arange(x.size) % 7)))) * (i + 1)
  return total
