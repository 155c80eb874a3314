"""What a run trained on, by content rather than by path: ``identity.json`` in its run directory.

The config keys ``policy`` and ``task_spec`` are paths, which differ between machines, so they
cannot say whether two runs started from the same weights and read the same data. A run's
identity holds digests of what the paths held when it started:

* ``policy``: SHA-256 of the checkpoint's ``config.json`` and weight files (``policy_digest``;
  None for the built-in character model, whose weights follow from the config's other keys);
* ``data``: {split: SHA-256} of the files of a file task's ``task_spec`` (``Task.reads_files``;
  a directory: of its files' relative paths and bytes, in sorted order; several paths: of their
  digests); None for the synthetic tasks, whose data follows from the config;
* ``dtype``: the compute and parameter dtypes of ``model``.

``scripts/train.py`` writes it beside ``config.json`` and refuses to resume a run directory
whose identity differs; the full-size aggregator (``experiments.harness.collect_runs``) refuses
to pool runs whose identities differ.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from typing import Any

FILE = "identity.json"
KEYS = ("policy", "data", "dtype")


def digest_path(path: str) -> str:
  """SHA-256 (hex) of a file's bytes, or of a directory's files (relative paths and bytes, in
  sorted order). OSError for a path that does not exist."""
  h = hashlib.sha256()
  if os.path.isdir(path):
    files = sorted(os.path.relpath(os.path.join(d, f), path)
                   for d, _, fs in os.walk(path) for f in fs)
    for rel in files:
      h.update(rel.encode() + b"\0")
      h.update(digest_path(os.path.join(path, rel)).encode())
    return h.hexdigest()
  st = os.stat(path)
  if time.time_ns() - st.st_mtime_ns < RECENT_NS:  # may still change within the clock's tick
    return _file_digest.__wrapped__(path, st.st_size, st.st_mtime_ns, st.st_ino)
  return _file_digest(os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)


# Files modified less than this long ago are digested afresh on every call.
RECENT_NS = 2 * 10 ** 9


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int, inode: int) -> str:
  """SHA-256 of a file, remembered for as long as its size, modification time and inode stay
  the same: a launch reads the identity when it checks the run directory and again when the
  run starts, and a 7B checkpoint is 15 GB."""
  del size, mtime_ns, inode  # the cache key
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".index.json")


def policy_digest(policy_dir: str) -> str:
  """SHA-256 over a checkpoint's ``config.json`` and its weight files (``WEIGHT_SUFFIXES``), by
  name and bytes in sorted order: a fine-tune of the same architecture differs. OSError when
  ``config.json`` cannot be read."""
  names = sorted(n for n in os.listdir(policy_dir) if n.endswith(WEIGHT_SUFFIXES))
  h = hashlib.sha256()
  for name in ["config.json"] + names:
    h.update(name.encode() + b"\0")
    h.update(digest_path(os.path.join(policy_dir, name)).encode())
  return h.hexdigest()


def _data_paths(task_spec: dict) -> dict[str, list[str]] | None:
  """{split: paths} of a file task's spec; None when the spec names no files."""
  out = {}
  for split, v in sorted(task_spec.items()):
    paths = [v] if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else None
    if not (paths and all(isinstance(p, str) for p in paths)):
      return None
    out[split] = paths
  return out or None


def of_config(cfg: Any) -> dict:
  """The identity of the run ``cfg`` (an RLConfig, or its dict) from the files it names.
  OSError naming the key and path for a file that cannot be read."""
  get = (lambda k: cfg[k]) if isinstance(cfg, dict) else (lambda k: getattr(cfg, k))
  policy = get("policy")
  out: dict[str, Any] = {"policy": None, "data": None}
  if policy:
    try:
      out["policy"] = policy_digest(policy)
    except OSError as e:
      raise OSError(f"config key 'policy': cannot read {e.filename or policy} "
                    f"({e.strerror or e})") from None
  from rlpost.tasks import catalog

  reads_files = get("task") in catalog.list_tasks() and catalog.get_task(
      get("task")).reads_files
  paths = _data_paths(dict(get("task_spec") or {})) if reads_files else None
  if paths is not None:
    out["data"] = {}
    for split, ps in paths.items():
      try:
        ds = [digest_path(p) for p in ps]
      except OSError as e:
        raise OSError(f"config key 'task_spec' ({split}): cannot read {e.filename} "
                      f"({e.strerror or e})") from None
      out["data"][split] = ds[0] if len(ds) == 1 else hashlib.sha256(
          "\0".join(ds).encode()).hexdigest()
  model = dict(get("model") or {})
  out["dtype"] = {"dtype": model.get("dtype", "float32"),
                  "param_dtype": model.get("param_dtype", "float32")}
  return out


def read(run_dir: str) -> dict | None:
  """``run_dir``'s identity, or None when it has none (a run older than identities).
  ValueError naming the file when it is not a JSON object with the identity's keys."""
  path = os.path.join(run_dir, FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      out = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} is unreadable ({e})") from None
  if not isinstance(out, dict) or set(KEYS) - set(out):
    raise ValueError(f"{path} is not a run identity (keys {list(KEYS)})")
  return out


def write(run_dir: str, ident: dict) -> None:
  """Writes ``identity.json`` atomically (a temporary file renamed over it)."""
  path = os.path.join(run_dir, FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(ident, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def differences(a: dict, b: dict) -> list[str]:
  """The identity keys on which ``a`` and ``b`` differ, in ``KEYS`` order."""
  return [k for k in KEYS if a.get(k) != b.get(k)]


def describe(ident: dict, key: str) -> str:
  """One identity entry in words, for an error line."""
  v = ident.get(key)
  if key == "policy":
    return "the built-in model" if v is None else f"config and weights sha256 {v[:12]}"
  if key == "data":
    return "synthetic" if v is None else ", ".join(f"{s} sha256 {d[:12]}"
                                                    for s, d in sorted(v.items()))
  return f"{v['dtype']} compute, {v['param_dtype']} parameters"
