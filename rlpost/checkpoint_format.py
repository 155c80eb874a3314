"""The on-disk format of rlpost's checkpoints: item names, flat leaf keys, integrity manifest.

Both the run loop's writer (``rlpost.train.checkpoint``) and the post-hoc averaging reader
(``rlpost.averaging.checkpoints``) use this module; it imports nothing from rlpost.

Layouts (all arrays are orbax ``StandardSave`` items of a flat dict):
  run checkpoint   ``<run dir>/<step>/state/``: the train state's leaves as
                   ``{flat_key(i): leaf}`` in ``jax.tree.leaves`` order; ``<run dir>/<step>/meta/``:
                   a JSON object (config, metrics, ...) whose ``INTEGRITY_KEY`` entry is the
                   ``manifest`` of those leaves.
  parameter tree   ``write_tree(path, params)``: the same flat dict at ``path`` (or at
                   ``path/<item>``, with other files beside it), no manifest; read back with
                   ``read_tree``.

Manifest: a JSON list, one entry per leaf in flat-key order,
``{"shape": [int, ...], "dtype": "float32", "crc32": int | None}``; ``crc32`` is the CRC-32 of the
leaf's C-order bytes, None for a leaf split over other processes.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import uuid
import warnings
import zlib
from typing import Any, Callable, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

STATE_ITEM = "state"
META_ITEM = "meta"
INTEGRITY_KEY = "integrity"

# Seconds a closing event loop waits for the tasks still pending on it before cancelling them.
SETTLE_TIMEOUT_S = 10.0


class _SettlingEventLoop(asyncio.SelectorEventLoop):
  """An event loop that settles its pending tasks before it closes.

  Orbax runs each synchronous save or restore on a fresh event loop that it closes as soon as the
  top-level coroutine returns (``orbax.checkpoint._src.asyncio_utils.run_sync``). When one read
  of a damaged checkpoint fails, ``asyncio.gather`` raises at once and leaves the other reads'
  tasks pending on that loop; closing it then strands their TensorStore futures, whose callbacks
  later print "RuntimeError: Event loop is closed" tracebacks from TensorStore's threads, and the
  abandoned tasks and futures log "exception was never retrieved" / "Exception ignored in" when
  collected. This loop first lets the pending tasks finish (they are reads already in flight; up
  to ``SETTLE_TIMEOUT_S``), then cancels what is left, and retrieves every outcome, as
  ``asyncio.run`` does for its own loop.
  """

  def close(self) -> None:
    if not self.is_running() and not self.is_closed():
      pending = [t for t in asyncio.all_tasks(self) if not t.done()]
      if pending:
        try:
          self.run_until_complete(asyncio.wait(pending, timeout=SETTLE_TIMEOUT_S))
          for t in pending:
            t.cancel()
          self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except Exception as e:  # noqa: BLE001 - closing must not fail; the loop is dropped anyway
          warnings.warn(f"settling pending orbax tasks before closing their event loop failed "
                        f"({type(e).__name__}: {e})", RuntimeWarning, stacklevel=2)
    super().close()


def settle_event_loops() -> None:
  """Make new event loops settle their pending tasks on close (``_SettlingEventLoop``).

  Installed when this module is imported, so every orbax call in the process (the run loop's
  ``Checkpointer``, ``CheckpointSource``, ``read_tree``) ends without stray tasks. Only asyncio's
  default policy is replaced; a policy the program chose (uvloop, say) is left alone. (Python
  3.14 deprecates event loop policies; the warning is not the caller's concern.)
  """
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    default = asyncio.DefaultEventLoopPolicy
    if type(asyncio.get_event_loop_policy()) is not default:
      return

    class SettlingPolicy(default):
      _loop_factory = _SettlingEventLoop

    asyncio.set_event_loop_policy(SettlingPolicy())


settle_event_loops()


def flat_key(i: int) -> str:
  """The key of leaf ``i`` (``jax.tree.leaves`` order) in a flat item: "00000", "00001", ..."""
  return f"{int(i):05d}"


def flat_dict(leaves: Sequence) -> dict[str, Any]:
  """``{flat_key(i): leaf}`` of a list of leaves."""
  return {flat_key(i): x for i, x in enumerate(leaves)}


def abstract_dict(leaves: Sequence) -> dict[str, Any]:
  """``{flat_key(i): ShapeDtypeStruct}`` of a template's leaves (their shardings kept), the
  restore target of a flat item."""
  return {flat_key(i): ocp.utils.to_shape_dtype_struct(x) for i, x in enumerate(leaves)}


# Longest text of an underlying error that a ``CheckpointError`` message carries.
CAUSE_LIMIT = 120
# The start of an annotation TensorStore appends to an error: " [tensorstore_spec[1]='{...}']".
_TS_ANNOTATION = re.compile(r" \[[A-Za-z_ ]+(?:\[\d+\])?=")


def _innermost(e: BaseException) -> BaseException:
  """The last error of ``e``'s ``__cause__`` chain (``e`` itself without a cause)."""
  seen = {id(e)}
  while e.__cause__ is not None and id(e.__cause__) not in seen:
    e = e.__cause__
    seen.add(id(e))
  return e


def short_cause(e: BaseException, limit: int = CAUSE_LIMIT) -> str:
  """The first line of the innermost error behind ``e`` (its ``__cause__`` chain), at most
  ``limit`` characters: TensorStore wraps a one-line reason in a dump of its whole spec, and orbax
  wraps that in an exception whose text is that dump again.

  TensorStore's trailing annotations (`` [tensorstore_spec='{...}']``, `` [source
  locations=...]``) are dropped. A longer line keeps its start (the error code and the key read)
  and its end (the reason) with " ... " between them; the middle is mostly the file's path, which
  the message names anyway.
  """
  e = _innermost(e)
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  text = _TS_ANNOTATION.split(lines[0], maxsplit=1)[0].strip() if lines else ""
  text = text or type(e).__name__
  if len(text) <= limit:
    return text
  keep = limit - len(" ... ")
  return text[:keep - keep // 2].rstrip() + " ... " + text[len(text) - keep // 2:].lstrip()


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be used: corrupt, truncated, or not matching the run.

  Attributes: ``step`` and ``directory`` of the offending checkpoint.

  Raised ``from`` an underlying error whose text the detail embeds (``f"... ({e!r})"``), the
  message (``str``) carries a summary of that error instead: its innermost cause's type and first
  line (``short_cause``), not an orbax repr that dumps a whole TensorStore spec (2,000 characters
  and more). ``full_message`` keeps the detail as written; the traceback chain keeps the cause.
  """

  def __init__(self, step: int, directory: str, detail: str):
    super().__init__(f"checkpoint at step {step} in {directory}: {detail}")
    self.step = step
    self.directory = directory

  @property
  def full_message(self) -> str:
    return super().__str__()

  def __str__(self) -> str:
    text = super().__str__()
    cause = self.__cause__
    if cause is None or isinstance(cause, CheckpointError):  # a CheckpointError is short already
      return text
    for embedded in (repr(cause), str(cause)):
      if embedded and embedded in text and (len(embedded) > CAUSE_LIMIT or "\n" in embedded):
        summary = f"{type(_innermost(cause)).__name__}: {short_cause(cause)}"
        return text.replace(embedded, summary)
    return text


def host_copy(x) -> np.ndarray | None:
  """The full value of a leaf on this host, or None when it is split over other processes."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if not x.sharding.is_fully_replicated:
      return None
    x = x.addressable_data(0)
  return np.asarray(jax.device_get(x))


def crc32_of(x: np.ndarray) -> int:
  """CRC-32 of an array's C-order bytes."""
  return zlib.crc32(np.ascontiguousarray(x).view(np.uint8).reshape(-1).data)


def manifest(leaves: Sequence) -> list[dict]:
  """Per leaf: shape, dtype and CRC-32 of the bytes (None for leaves split over processes)."""
  out = []
  for x in leaves:
    host = host_copy(x)
    out.append({"shape": list(np.shape(x)), "dtype": str(np.dtype(x.dtype)),
                "crc32": None if host is None else crc32_of(host)})
  return out


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def _staging_suffix() -> str:
  """A random suffix, the same on every process (process 0's)."""
  token = np.int32(uuid.uuid4().int & 0x7FFFFFFF)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    token = multihost_utils.broadcast_one_to_all(token)
  return f"{int(token):08x}"


def write_tree(path: str, tree: Any, *, item: str | None = None, overwrite: bool = False,
               add_files: Callable[[str], None] | None = None) -> str:
  """Atomically write ``tree``'s leaves as a flat item; returns the absolute ``path``.

  item: None writes the flat item at ``path`` itself; a name writes it at ``path/<item>``.
  add_files: called with the staging directory (process 0 only) to write other files beside
    the item before it is renamed into place.
  overwrite: replace an existing ``path`` (renamed aside, then removed); else FileExistsError.

  Everything goes into ``<path>.tmp-<random>`` first and is renamed to ``path`` only when
  complete; on any error the staging directory is removed and ``path`` is untouched.
  """
  path = os.path.abspath(path)
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
  primary = jax.process_index() == 0
  suffix = _staging_suffix()
  tmp = f"{path}.tmp-{suffix}"
  if primary:
    os.makedirs(os.path.dirname(path), exist_ok=True)
  try:
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(tmp if item is None else os.path.join(tmp, item),
                 flat_dict(jax.tree.leaves(tree)))
      ckptr.wait_until_finished()
    if primary:
      if add_files is not None:
        add_files(tmp)
      if os.path.exists(path):
        old = f"{path}.old-{suffix}"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
      else:
        os.rename(tmp, path)
  except BaseException:
    if primary:
      shutil.rmtree(tmp, ignore_errors=True)
    raise
  _sync(f"rlpost-write-tree-{suffix}")
  return path


def read_tree(path: str, like: Any = None) -> Any:
  """Read a flat item (what ``write_tree`` wrote at ``path``, or a run checkpoint's state item).

  like: a template pytree; the result has its structure, shapes, dtypes and shardings. Without
    it: a dict by flat key, as stored.
  """
  path = os.path.abspath(path)
  with ocp.StandardCheckpointer() as ckptr:
    if like is None:
      return ckptr.restore(path)
    leaves, treedef = jax.tree.flatten(like)
    out = ckptr.restore(path, abstract_dict(leaves))
  return jax.tree.unflatten(treedef, [out[flat_key(i)] for i in range(len(leaves))])
