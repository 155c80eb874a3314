"""Reading parameters out of a run's orbax checkpoints, and writing averaged ones atomically.

The project's ``rlpost.train.checkpoint.Checkpointer`` stores the whole train state (parameters,
optimizer state, PRNG key, step, data cursor) in the layout of ``rlpost.checkpoint_format``: a
flat dict of its leaves, keyed "00000", "00001", ... in ``jax.tree.leaves`` order, under
``<dir>/<step>/state``, with a JSON item under ``<dir>/<step>/meta``. ``CheckpointSource``
restores only the parameter leaves (an orbax partial restore: the other keys are never opened, so
optimizer state costs no I/O and no memory), directly onto target shardings, and checks before
reading any array that every selected checkpoint holds the same keys with the same shapes and
dtypes.

Which keys are parameters:
  ``like`` + ``select``  a template of the whole train state and a function picking its parameter
                         subtree (``lambda s: s.params``); restored trees then have that subtree's
                         structure. ``param_key_indices`` exposes the mapping.
  ``keys``               explicit flat keys or indices; restored values are a dict by key.
  ``keys="auto"``        the first ``param_leaves`` leaves when the meta item declares that
                         count (rlpost's run loop does), else the leading floating-point
                         leaves before the first integer leaf (the
                         parameters of a state laid out as (params, optax state, ...) with an Adam
                         step count first in the optimizer state); printed by the CLI, override it
                         when the layout differs.
  ``keys="all"``         every leaf.

Integrity: ``load`` checks every restored leaf against the CRC-32 manifest that the run loop's
``Checkpointer`` stores in the meta item, so a checkpoint without a manifest (not written by
rlpost's run loop, or damaged) is refused unless the source is opened with ``verify=False``. A
file that cannot be read or parsed (a truncated array chunk, metadata JSON or OCDBT manifest)
raises ``rlpost.checkpoint_format.CheckpointError`` (the class ``rlpost.train.checkpoint``
re-exports) naming the step, the file or directory, and the first line of the underlying error.
A step directory without its state or meta item (``scan_steps``) stays among the steps, so a
selection (the latest, the last k) is what it would be were it intact, and selecting it raises
``CheckpointError`` naming it, as a resumed run refuses a damaged latest checkpoint; steps chosen
around it (``--step``, ``--end``) are read as usual.

``write_params`` writes an averaged parameter tree (same flat layout, readable with
``rlpost.train.checkpoint.load_params(out/"params", like)``) plus ``averaging.json`` into a
temporary directory next to the target and renames it into place only when complete, so a crash
mid-average or mid-write leaves no partial output.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, NoReturn, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from rlpost import paths
from rlpost.checkpoint_format import (INTEGRITY_KEY, META_ITEM, STATE_ITEM, CheckpointError,
                                     crc32_of, flat_key, host_copy, read_tree, short_cause,
                                     write_tree)

Params = Any


def param_key_indices(like: Any, select: Callable[[Any], Any]) -> Any:
  """The flat-key indices of the leaves ``select(like)`` picks, in the subtree's structure.

  like: the full train-state template (what ``Checkpointer.save`` was given).
  select: a structural accessor, e.g. ``lambda s: s.params``.
  """
  leaves, treedef = jax.tree.flatten(like)
  marked = jax.tree.unflatten(treedef, [_Index(i) for i in range(len(leaves))])
  sub = select(marked)
  idx = jax.tree.leaves(sub, is_leaf=lambda x: isinstance(x, _Index))
  if not idx or not all(isinstance(i, _Index) for i in idx):
    raise ValueError("select(like) must return a subtree of like's leaves")
  return jax.tree.map(lambda i: i.i, sub, is_leaf=lambda x: isinstance(x, _Index))


class _Index:
  """A marker leaf carrying a flat index (not an array, so pytree maps leave it alone)."""

  def __init__(self, i: int):
    self.i = i

  def __repr__(self):
    return f"_Index({self.i})"


def parse_key_ranges(spec: str) -> list[int]:
  """'0-57,60' -> [0, ..., 57, 60]."""
  out = []
  for part in spec.split(","):
    part = part.strip()
    if not part:
      continue
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
    if not m:
      raise ValueError(f"bad key range {part!r}; expected e.g. '0-57,60'")
    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
    if hi < lo:
      raise ValueError(f"bad key range {part!r}: end before start")
    out.extend(range(lo, hi + 1))
  if not out:
    raise ValueError(f"empty key range {spec!r}")
  return out


def _require_directory(directory: str) -> None:
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise NotADirectoryError(f"checkpoint directory {directory} is a file, not a directory")
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"checkpoint directory {directory} does not exist")


def scan_steps(directory: str, items: Sequence[str] = (STATE_ITEM, META_ITEM)
               ) -> tuple[list[int], dict[int, str]]:
  """(the steps of every checkpoint directory in ``directory``, {step: what it lacks}).

  A checkpoint directory is an entry named by a step number (orbax's temporary directories,
  ``<step>.orbax-checkpoint-tmp-...``, are not); it is incomplete when it is not a directory or
  lacks one of ``items`` (a directory each). These are the steps ``Checkpointer`` (and so a
  resumed run) sees: an incomplete one is damaged, never silently left out.
  """
  _require_directory(directory)
  steps, incomplete = [], {}
  for name in os.listdir(directory):
    if not name.isdigit():
      continue
    step, path = int(name), os.path.join(directory, name)
    steps.append(step)
    if not os.path.isdir(path):
      incomplete[step] = "is a file, not a checkpoint directory"
      continue
    missing = [item for item in items if not os.path.isdir(os.path.join(path, item))]
    if missing:
      incomplete[step] = f"has no {' or '.join(i + '/' for i in missing)} item"
  return sorted(steps), incomplete


def list_steps(directory: str) -> list[int]:
  """Steps of the checkpoints in ``directory`` holding a state item (``scan_steps`` lists the
  others too)."""
  steps, incomplete = scan_steps(directory, items=(STATE_ITEM,))
  return [s for s in steps if s not in incomplete]


def incomplete_error(directory: str, step: int, what: str) -> CheckpointError:
  """The error for checkpoint ``step`` of ``directory`` that ``scan_steps`` found incomplete."""
  path = os.path.join(directory, str(int(step)))
  return CheckpointError(step, directory, f"{path} {what} (damaged or partly deleted); select "
                         "other steps explicitly (scripts/export.py --step, scripts/average.py "
                         "--end) or move it aside")


def refuse_incomplete(directory: str, steps: Sequence[int], incomplete: dict[int, str]) -> None:
  """Raise ``incomplete_error`` for the first of ``steps`` that is in ``incomplete``."""
  for step in steps:
    if step in incomplete:
      raise incomplete_error(directory, step, incomplete[step])


class CheckpointSource:
  """Parameter-only access to the checkpoints of one run directory.

  directory: the Checkpointer's directory (holding ``<step>/state``).
  like, select: a train-state template and a parameter accessor (see module docstring); or
  keys: "auto", "all", a range string ("0-57"), or a sequence of flat keys / indices.
  shardings: target placement of each restored parameter: a pytree matching the output, a single
    ``jax.sharding.Sharding`` for all, or None (the default device).
  verify: check each loaded leaf against the meta item's integrity manifest (the default); a
    checkpoint without one is an error. ``False`` reads checkpoints written by other tools (plain
    orbax) unchecked.

  ``steps`` lists every checkpoint directory, incomplete ones too (``scan_steps``: without a
  state item, or without a meta item when verifying), so a selection over ``steps`` is what it
  would be were they intact, and reading an incomplete one raises ``CheckpointError`` naming it.
  ``keys="auto"`` and ``run_config`` read the latest complete checkpoint.
  """

  def __init__(self, directory: str, *, like: Any = None, select: Callable | None = None,
               keys: str | Sequence[int | str] | None = None, shardings: Any = None,
               verify: bool = True):
    self.directory = os.path.abspath(directory)
    self.verify = verify
    self.steps, self.incomplete = scan_steps(
        self.directory, items=(STATE_ITEM, META_ITEM) if verify else (STATE_ITEM,))
    self._treedef = None
    if like is not None:
      if keys is not None:
        raise ValueError("pass either like/select or keys, not both")
      select = select or (lambda s: s)
      idx_tree = param_key_indices(like, select)
      idx, self._treedef = jax.tree.flatten(idx_tree)
      self.keys = [flat_key(i) for i in idx]
      template = jax.tree.leaves(select(like))
      self._expected = {k: (tuple(np.shape(x)), np.dtype(x.dtype))
                        for k, x in zip(self.keys, template)}
    else:
      self._expected = None
      self.keys = self._resolve_keys("auto" if keys is None else keys)
    self._shardings = self._resolve_shardings(shardings)

  # ------------------------------------------------------------------------------- metadata
  def _state_path(self, step: int) -> str:
    return os.path.join(self.directory, str(int(step)), STATE_ITEM)

  def _check_step(self, step: int) -> None:
    if step not in self.steps:
      raise ValueError(f"no checkpoint at step {step} in {self.directory} "
                       f"(available: {self.steps})")
    refuse_incomplete(self.directory, [step], self.incomplete)

  def refuse_incomplete(self, steps: Sequence[int]) -> None:
    """Raise ``CheckpointError`` for the first of ``steps`` whose directory is incomplete."""
    refuse_incomplete(self.directory, steps, self.incomplete)

  def _latest_complete(self) -> int:
    """The latest complete checkpoint (``keys="auto"`` reads its layout)."""
    complete = [s for s in self.steps if s not in self.incomplete]
    if not complete:
      if self.steps:
        raise incomplete_error(self.directory, self.steps[-1], self.incomplete[self.steps[-1]])
      raise ValueError(f"no checkpoints in {self.directory}")
    return complete[-1]

  def stored_keys(self, step: int) -> list[str]:
    """The flat keys stored at ``step``, from the checkpoint's JSON tree metadata."""
    self._check_step(step)
    path = os.path.join(self._state_path(step), "_METADATA")
    data = self._read_json(step, path)
    tree = data.get("tree_metadata") if isinstance(data, dict) else None
    if not isinstance(tree, dict):
      self._damaged(step, path, "has no tree_metadata object")
    keys = []
    for entry in tree.values():
      km = (entry.get("key_metadata") if isinstance(entry, dict) else None) or []
      if len(km) != 1:
        raise ValueError(f"checkpoint at step {step} is not a flat dict of leaves (the "
                         f"Checkpointer layout); found a nested key {km}")
      keys.append(str(km[0]["key"]))
    return sorted(keys)

  def leaf_metadata(self, step: int,
                    keys: Sequence[str] | None = None) -> dict[str, tuple[tuple, np.dtype]]:
    """{flat key: (global shape, dtype)} of ``keys`` (default: the parameter keys) at ``step``.

    Reads only those keys' small zarr headers; no array data and no other key is touched.
    """
    self._check_step(step)
    keys = self.keys if keys is None else list(keys)
    kv = self._kvstore(step)
    out = {}
    for k in keys:
      try:
        r = kv.read(f"{k}/.zarray").result()
        if r.state != "value":
          continue
        header = json.loads(bytes(r.value))
        out[k] = (tuple(header["shape"]), np.dtype(jnp.dtype(header["dtype"])))
      except Exception as e:  # noqa: BLE001 - any failure to read the header is damage
        self._damaged(step, self._state_path(step),
                      f"cannot be read (the header of array {k}: {short_cause(e)})", e)
    return out

  def _kvstore(self, step: int):
    path = self._state_path(step)
    if os.path.exists(os.path.join(path, "manifest.ocdbt")):
      spec = {"driver": "ocdbt", "base": f"file://{path}"}
    else:
      spec = {"driver": "file", "path": path + "/"}
    try:
      return ts.KvStore.open(spec).result()
    except Exception as e:  # noqa: BLE001
      self._damaged(step, path, f"cannot be opened ({short_cause(e)})", e)

  def _damaged(self, step: int, path: str, detail: str,
               cause: BaseException | None = None) -> NoReturn:
    """Raise ``CheckpointError`` for ``step``: ``path`` (a file or directory) ``detail``."""
    raise CheckpointError(step, self.directory, f"{path} {detail}") from cause

  def _read_json(self, step: int, path: str) -> Any:
    """The JSON in ``path`` of checkpoint ``step``; unreadable or malformed: ``CheckpointError``."""
    try:
      with open(path) as f:
        return json.load(f)
    except (OSError, ValueError) as e:
      self._damaged(step, path, f"is unreadable or not valid JSON ({short_cause(e)})", e)

  def _meta(self, step: int) -> Any:
    """The meta item's JSON at ``step``, or None when the checkpoint has no meta file."""
    path = os.path.join(self.directory, str(int(step)), META_ITEM, "metadata")
    if not os.path.exists(path):
      return None
    return self._read_json(step, path)

  def _resolve_keys(self, keys) -> list[str]:
    if isinstance(keys, str) and keys not in ("auto", "all"):
      keys = parse_key_ranges(keys)
    if isinstance(keys, str):
      ref = self._latest_complete()
      names = self.stored_keys(ref)
      if keys == "all":
        return names
      declared = self._declared_param_leaves(ref)
      if declared is not None:
        return names[:declared]
      out = []
      for k in names:
        md = self.leaf_metadata(ref, [k])
        if k not in md or not jnp.issubdtype(md[k][1], jnp.floating):
          break
        out.append(k)
      if not out:
        raise ValueError(f"keys='auto' found no leading floating-point leaves at step "
                         f"{ref}; pass keys explicitly")
      return out
    return [flat_key(k) if isinstance(k, (int, np.integer)) else str(k) for k in keys]

  def _resolve_shardings(self, shardings) -> list:
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if shardings is None:
      return [default] * len(self.keys)
    if isinstance(shardings, jax.sharding.Sharding):
      return [shardings] * len(self.keys)
    flat = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    if isinstance(shardings, dict) and self._treedef is None:
      flat = [shardings[k] for k in self.keys]
    if len(flat) != len(self.keys):
      raise ValueError(f"got {len(flat)} shardings for {len(self.keys)} parameter leaves")
    return flat

  def describe_keys(self) -> str:
    idx = [int(k) for k in self.keys]
    runs, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
      if b != a + 1:
        runs.append(f"{flat_key(start)}-{flat_key(a)}" if a != start else flat_key(a))
        start = b
    return ", ".join(runs)

  def validate(self, steps: Sequence[int]) -> dict[str, tuple[tuple, np.dtype]]:
    """Check that every step exists and holds the parameter keys with equal shapes and dtypes.

    Returns the common {key: (shape, dtype)}. Errors name the first offending step and key.
    """
    if not steps:
      raise ValueError("the checkpoint selection is empty; nothing to average")
    ref = self._expected
    ref_step = "the template" if ref is not None else None
    for step in steps:
      md = self.leaf_metadata(step)
      missing = [k for k in self.keys if k not in md]
      if missing:
        stored = len(self.stored_keys(step))
        raise ValueError(f"checkpoint at step {step} has no parameter leaves {missing[:5]} "
                         f"(it has {stored} leaves); mismatched trees")
      got = {k: md[k] for k in self.keys}
      if ref is None:
        ref, ref_step = got, f"step {step}"
        continue
      for k in self.keys:
        if got[k][0] != ref[k][0]:
          raise ValueError(f"checkpoint at step {step}: leaf {k} has shape {got[k][0]}, but "
                           f"{ref_step} has {ref[k][0]}")
        if got[k][1] != ref[k][1]:
          raise ValueError(f"checkpoint at step {step}: leaf {k} has dtype {got[k][1]}, but "
                           f"{ref_step} has {ref[k][1]}")
    return ref

  # ---------------------------------------------------------------------------------- reads
  def load(self, step: int) -> Params:
    """Restore only the parameter leaves of ``step``, placed on the target shardings."""
    spec = self.validate([step])
    abstract = {k: jax.ShapeDtypeStruct(spec[k][0], spec[k][1], sharding=s)
                for k, s in zip(self.keys, self._shardings)}
    restore_args = {k: ocp.ArrayRestoreArgs(sharding=s, global_shape=spec[k][0], dtype=spec[k][1])
                    for k, s in zip(self.keys, self._shardings)}
    try:
      # A checkpointer per read, closed on every path (a failed read included).
      with ocp.PyTreeCheckpointer() as ckptr:
        out = ckptr.restore(self._state_path(step), args=ocp.args.PyTreeRestore(
            item=abstract, restore_args=restore_args, partial_restore=True))
      values = [out[k] for k in self.keys]
    except Exception as e:  # noqa: BLE001 - a read failure after validate() is damaged data
      self._damaged(step, self._state_path(step),
                    f"has parameter arrays that cannot be read ({short_cause(e)})", e)
    self._verify(step, values)
    if self._treedef is not None:
      return jax.tree.unflatten(self._treedef, values)
    return dict(zip(self.keys, values))

  def _verify(self, step: int, values: list) -> None:
    """Check the loaded leaves against the CRC-32 manifest the run loop's Checkpointer saved.

    A checkpoint without a meta file or without a manifest is refused (``CheckpointError``):
    without one, flipped bytes on disk would be averaged in unnoticed. Skipped entirely when the
    source was opened with ``verify=False``; leaves split over other processes are not checked.
    """
    if not self.verify:
      return
    meta = self._meta(step)
    manifest = meta.get(INTEGRITY_KEY) if isinstance(meta, dict) else None
    if not isinstance(manifest, list) or not manifest:
      where = os.path.join(str(int(step)), META_ITEM, "metadata")
      found = "no such file" if meta is None else f"no {INTEGRITY_KEY!r} entry"
      raise CheckpointError(
          step, self.directory, f"has no integrity manifest ({where}: {found}); it was not "
          f"written by rlpost's run loop or is damaged (verify=False, or --no-verify in "
          f"scripts/average.py, reads it unchecked)")
    for k, v in zip(self.keys, values):
      if not k.isdigit() or int(k) >= len(manifest):
        continue
      want = manifest[int(k)].get("crc32")
      host = host_copy(v)
      if want is not None and host is not None and crc32_of(host) != want:
        raise CheckpointError(step, self.directory,
                              f"array {k} fails its checksum (corrupted on disk)")

  def _declared_param_leaves(self, step: int) -> int | None:
    """The meta item's "param_leaves" (written by rlpost's run loop), if present."""
    meta = self._meta(step)
    n = meta.get("param_leaves") if isinstance(meta, dict) else None
    return int(n) if isinstance(n, int) and n > 0 else None

  def run_config(self, step: int | None = None) -> dict:
    """The run config rlpost's run loop recorded in the meta item of ``step`` (default: the
    latest complete checkpoint); {} when there is none."""
    if step is None and self.steps:
      step = self._latest_complete()
    meta = self._meta(step) if step is not None else None
    config = meta.get("config") if isinstance(meta, dict) else None
    return config if isinstance(config, dict) else {}

  def metrics(self, step: int) -> dict:
    """Scalar metrics recorded for ``step``: orbax's step metrics, then the meta item's
    "metrics" dict and top-level numbers (later sources do not override earlier ones)."""
    refuse_incomplete(self.directory, [step], self.incomplete)
    out: dict = {}
    root = os.path.join(self.directory, str(int(step)))
    path = os.path.join(root, "_CHECKPOINT_METADATA")
    if os.path.exists(path):
      recorded = self._read_json(step, path)
      if isinstance(recorded, dict) and isinstance(recorded.get("metrics"), dict):
        out.update(recorded["metrics"])
    meta = self._meta(step)
    if isinstance(meta, dict):
      for src in (meta.get("metrics") or {}, meta):
        for k, v in src.items():
          if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.setdefault(k, float(v))
    return out

  def close(self) -> None:
    """Nothing to release: each ``load`` opens and closes its own orbax checkpointer (kept so
    ``with CheckpointSource(...)`` and ``close()`` callers need no change)."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def metrics_from_jsonl(path: str, key: str) -> dict[int, float]:
  """{step: value} of ``key`` from a run's ``metrics.jsonl`` (the last record per step wins).

  A last line cut by a killed or running writer is skipped; a bad line elsewhere is an error
  naming the file and line."""
  out = {}
  with open(path) as f:
    lines = f.readlines()
  for i, line in enumerate(lines, 1):
    if line.strip():
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        if i == len(lines) and not line.endswith("\n"):
          continue
        raise ValueError(f"{path}, line {i}: not JSON ({e.msg})") from None
      if isinstance(rec, dict) and key in rec and "step" in rec:
        out[int(rec["step"])] = float(rec[key])
  return out


# ------------------------------------------------------------------------------------- output
def write_params(out_dir: str, params: Params, info: dict, *, overwrite: bool = False) -> str:
  """Atomically write ``params`` (flat leaves under ``out_dir/params``) and ``averaging.json``.

  Everything is written into ``<out_dir>.tmp-<random>`` first and renamed into place at the end
  (``rlpost.checkpoint_format.write_tree``); on any error the temporary directory is removed and
  ``out_dir`` is untouched.
  """
  # Never into or over a run's checkpoints, nor over a run (``rlpost.paths.check_output``).
  paths.check_output(out_dir, "output", overwrite=overwrite)
  if os.path.exists(out_dir) and not overwrite:
    raise FileExistsError(f"{os.path.abspath(out_dir)} exists; pass overwrite=True (--overwrite) "
                          f"to replace it")

  def add_info(tmp: str) -> None:
    with open(os.path.join(tmp, "averaging.json"), "w") as f:
      json.dump(info, f, indent=2, sort_keys=True, default=_jsonable)

  return write_tree(out_dir, params, item="params", overwrite=overwrite, add_files=add_info)


def _jsonable(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def read_params(out_dir: str, like: Any = None) -> tuple[Params, dict]:
  """Read what ``write_params`` wrote: (params, info). Without ``like``: a dict by flat key."""
  with open(os.path.join(out_dir, "averaging.json")) as f:
    info = json.load(f)
  return read_tree(os.path.join(out_dir, "params"), like), info
