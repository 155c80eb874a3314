"""Pinned testbeds: a tree of arrays (a starting policy's parameters, or a dataset's splits)
stored as one ``.npz`` named by its content digest.

A table that starts from a trained policy (an SFT warm start) loads it from a committed file
``<name>-<digest>.npz`` instead of retraining it, so every machine starts from the same weights.
The digest is a hash of the arrays and their names (each leaf's path in the tree, dtype, shape
and bytes), not of the file, so it does not depend on how the archive was written; a change of
the model's parameter names is a change of the testbed. ``load`` recomputes it and refuses
a file whose content does not match its name (damaged, edited or renamed), and a tree whose
structure, shapes or dtypes differ from the model's.

The config key ``init_params`` (``rlpost.train.rl_config``) names such a file for the character
model; the round-trip tables load their datasets the same way (``experiments/testbeds``).
``scripts/testbed.py build`` makes one and prints its digest.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from typing import Any

import jax
import numpy as np

DIGEST_LEN = 16
_NAME = re.compile(r"^(?P<name>.+)-(?P<digest>[0-9a-f]{%d})\.npz$" % DIGEST_LEN)


class PinnedError(ValueError):
  """A pinned file that cannot be used (named in the message)."""


def _leaves(tree: Any) -> list[tuple[str, np.ndarray]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(jax.tree_util.keystr(path), np.asarray(jax.device_get(leaf))) for path, leaf in flat]


def digest(tree: Any) -> str:
  """The content digest of a parameter tree: sha256 over its leaves in path order (path, dtype,
  shape, little-endian C-order bytes), first ``DIGEST_LEN`` hex digits."""
  h = hashlib.sha256()
  for key, x in sorted(_leaves(tree)):
    x = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))
    h.update(f"{key}|{x.dtype.str}|{x.shape}\n".encode())
    h.update(x.tobytes())
  return h.hexdigest()[:DIGEST_LEN]


def parse_name(path: str) -> tuple[str, str]:
  """(name, digest) of a pinned file's name ``<name>-<16 hex digits>.npz``."""
  m = _NAME.match(os.path.basename(path))
  if m is None:
    raise PinnedError(f"{path}: a pinned file is named <name>-<{DIGEST_LEN} hex digits>.npz "
                      "(scripts/testbed.py build writes one)")
  return m["name"], m["digest"]


def save(tree: Any, directory: str, name: str) -> str:
  """Write ``tree`` to ``directory/<name>-<digest>.npz`` (atomically; an existing file of that
  name has the same content by construction and is left as it is). Returns the path."""
  if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
    raise PinnedError(f"testbed name {name!r}: use letters, digits, '.', '_' and '-'")
  path = os.path.join(directory, f"{name}-{digest(tree)}.npz")
  if os.path.exists(path):
    return path
  os.makedirs(directory, exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      np.savez(f, **dict(_leaves(tree)))
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


def read(path: str) -> dict[str, np.ndarray]:
  """The arrays of an ``.npz`` file by leaf path, unchecked (``PinnedError`` naming a missing or
  unreadable file)."""
  if not os.path.isfile(path):
    raise PinnedError(f"{path}: no such pinned file")
  try:
    with np.load(path, allow_pickle=False) as z:
      return {k: z[k] for k in z.files}
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise PinnedError(f"{path}: not a readable .npz ({e})") from None


def load(path: str, like: Any) -> Any:
  """The tree in ``path`` with the structure of ``like`` (same leaf paths, shapes and dtypes),
  after checking that its content digest equals the one in its name."""
  _, want = parse_name(path)
  stored = read(path)
  flat, treedef = jax.tree_util.tree_flatten_with_path(like)
  keys = [jax.tree_util.keystr(p) for p, _ in flat]
  missing = [k for k in keys if k not in stored]
  extra = sorted(set(stored) - set(keys))
  if missing or extra:
    raise PinnedError(f"{path}: its arrays do not fit what it is loaded into (missing "
                      f"{missing[:3]}, unexpected {extra[:3]}); was it built for another model "
                      "config or dataset?")
  leaves = []
  for k, (_, leaf) in zip(keys, flat):
    x = stored[k]
    if x.shape != tuple(leaf.shape) or x.dtype != np.dtype(leaf.dtype):
      raise PinnedError(f"{path}: parameter {k} is {x.dtype}{list(x.shape)}, the model's is "
                        f"{np.dtype(leaf.dtype)}{list(leaf.shape)}")
    leaves.append(x)
  tree = jax.tree_util.tree_unflatten(treedef, leaves)
  got = digest(tree)
  if got != want:
    raise PinnedError(f"{path}: content digest {got} does not match its name ({want}); the file "
                      "was changed after it was written: restore it (git checkout) or rebuild it "
                      "with scripts/testbed.py build")
  return jax.tree.map(jax.numpy.asarray, tree)
