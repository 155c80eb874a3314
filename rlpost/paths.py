"""Where a command may write: locations checked before work, outputs that never clobber a run,
and one writer per run directory.

Every command that writes (``scripts/train.py``, ``average.py``, ``export.py``) checks its
locations before any data, model, warm-start or averaging work:

- ``check_writable(path, what)``: ``path`` (or, when it does not exist yet, the nearest existing
  directory above it) is a directory, is writable, and its filesystem has at least
  ``min_free_mb()`` MiB free (``RLPOST_MIN_FREE_MB``, default 64). A failure is one line naming
  the key or flag (``what``) and the path.
- ``check_output(out, what, reads=..., overwrite=...)``: an output never is, contains or lies
  inside a directory the command reads, never lies inside a checkpoint directory, and never
  replaces a run or checkpoint directory; with ``overwrite`` it also never replaces anything
  inside a run directory.
- ``RunLock(run_dir)``: an exclusive OS lock (``flock``) on the run directory itself, held by
  the one process that trains in it. The kernel drops it when that process dies, however it
  dies, so a stale lock never blocks a resume; a second process gets ``RunDirLocked`` naming the
  holder's pid. Nothing is written to take the lock.

``StorageError`` is a write that failed during a run (a full disk, a filesystem gone read-only):
the scripts report it as one line.

This module imports nothing of rlpost's, so every layer may use it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import warnings

MIN_FREE_ENV = "RLPOST_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 64.0
RUN_FILES = ("config.json",)
RUN_MARKERS = ("checkpoints", "metrics.jsonl")
# Files orbax writes into each step directory of a checkpoint directory.
_STEP_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")


# flock errors of filesystems without it (Lustre without -o flock, some FUSE and NFS mounts).
_NO_FLOCK = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL})


class StorageError(OSError):
  """A write during a run failed (no space left, read-only filesystem, ...)."""


class RunDirLocked(RuntimeError):
  """Another live process holds the run directory's lock."""


def min_free_mb() -> float:
  """The free space (MiB) a writing command needs where it writes (``RLPOST_MIN_FREE_MB``)."""
  text = os.environ.get(MIN_FREE_ENV, "")
  if not text.strip():
    return DEFAULT_MIN_FREE_MB
  try:
    value = float(text)
  except ValueError:
    raise ValueError(f"environment variable {MIN_FREE_ENV}={text!r} is not a number") from None
  if not value >= 0:
    raise ValueError(f"environment variable {MIN_FREE_ENV}={text!r} must be >= 0")
  return value


def _existing_ancestor(path: str) -> str:
  """``path`` itself if it exists, else the nearest existing directory (or file) above it."""
  p = os.path.abspath(path)
  while not os.path.lexists(p):
    parent = os.path.dirname(p)
    if parent == p:
      break
    p = parent
  return p


def check_writable(path: str, what: str, *, min_free: float | None = None) -> None:
  """Raise one line naming ``what`` and ``path`` unless a command can create and write
  ``path`` (a directory): it, or the nearest existing directory above it, is a writable
  directory on a filesystem with at least ``min_free`` MiB free (default ``min_free_mb()``).
  Nothing is created."""
  path = os.path.abspath(path)
  base = _existing_ancestor(path)
  if not os.path.isdir(base):
    where = "" if base == path else f" ({base} is a file)"
    raise NotADirectoryError(f"{what}: {path} cannot be a directory{where}")
  if not os.access(base, os.W_OK | os.X_OK):
    reason = ("its filesystem is read-only" if _read_only(base)
              else "permission denied")
    where = "" if base == path else f" (nothing can be created in {base})"
    raise PermissionError(f"{what}: {path} is not writable: {reason}{where}")
  need = min_free_mb() if min_free is None else min_free
  free = shutil.disk_usage(base).free / 2**20
  if free < need:
    raise ValueError(f"{what}: {path} has {free:.1f} MiB free on its filesystem, below the "
                     f"{need:g} MiB a run needs ({MIN_FREE_ENV} sets the minimum)")


def _read_only(path: str) -> bool:
  try:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
  except OSError:
    return False


def is_run_dir(path: str) -> bool:
  """A training run's directory: ``config.json`` beside ``checkpoints/`` or ``metrics.jsonl``,
  or (its ``config.json`` gone) a ``checkpoints/`` directory holding step checkpoints."""
  if not os.path.isdir(path):
    return False
  if (all(os.path.isfile(os.path.join(path, f)) for f in RUN_FILES)
      and any(os.path.exists(os.path.join(path, m)) for m in RUN_MARKERS)):
    return True
  return _has_steps(os.path.join(path, "checkpoints"))


def _has_steps(path: str) -> bool:
  """``path`` holds a numbered step directory that orbax wrote."""
  try:
    names = os.listdir(path)
  except OSError:
    return False
  return any(n.isdigit() and any(os.path.exists(os.path.join(path, n, m)) for m in _STEP_MARKERS)
             for n in names)


def is_checkpoint_dir(path: str) -> bool:
  """A directory of orbax step checkpoints (``checkpoints/`` of a run, or any directory with a
  numbered step directory that orbax wrote)."""
  if not os.path.isdir(path):
    return False
  if os.path.basename(os.path.normpath(path)) == "checkpoints" and is_run_dir(
      os.path.dirname(os.path.abspath(path))):
    return True
  return _has_steps(path)


def _inside(child: str, parent: str) -> bool:
  """``child`` is ``parent`` or lies below it (absolute, normalised paths)."""
  return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_output(out: str, what: str, *, reads: tuple[str, ...] | list[str] = (),
                 overwrite: bool = False) -> None:
  """Refuse (one line naming ``what``) an output directory that would destroy a run.

  Always refused: ``out`` is or contains a directory in ``reads`` (what the command reads),
  lies inside a checkpoint directory, or is a run or checkpoint directory. When an existing
  ``out`` would be replaced (``overwrite``), also ``out`` lying inside a directory it reads or
  inside any run directory, and ``out`` holding a run or checkpoint directory anywhere below it.
  A new directory inside a run (``runs/x/lawa``) is allowed. The path is checked as written
  (a symbolic link is what gets replaced) and resolved (where the data lives).
  """
  plain = os.path.normpath(os.path.abspath(out))
  real = os.path.realpath(out)
  replaces = overwrite and os.path.lexists(plain)
  for r in reads:
    for r_path in {os.path.normpath(os.path.abspath(r)), os.path.realpath(r)}:
      for o in (plain, real):
        if o == r_path:
          raise ValueError(f"{what} {out} is the directory this command reads ({r}); choose "
                           "another directory")
        if _inside(r_path, o) or (replaces and _inside(o, r_path)):
          how = "contains" if _inside(r_path, o) else "lies inside"
          raise ValueError(f"{what} {out} {how} {r}, which this command reads; choose a "
                           "directory outside it")
  for o in dict.fromkeys((plain, real)):
    _check_ancestors(out, o, what, replaces)
  if replaces and os.path.isdir(real):
    for d, subdirs, _ in os.walk(real):  # links inside are not followed
      for n in subdirs:
        sub = os.path.join(d, n)
        if is_run_dir(sub) or is_checkpoint_dir(sub):
          raise ValueError(f"{what} {out} holds the run or checkpoints {sub}: --overwrite never "
                           "replaces a run; choose another directory")


def _check_ancestors(out: str, path: str, what: str, replaces: bool) -> None:
  """``path`` (absolute) is not a run or checkpoint directory and lies in no checkpoint
  directory, nor (when it is replaced) in a run."""
  if is_checkpoint_dir(path):
    raise ValueError(f"{what} {out} is a checkpoint directory; nothing replaces checkpoints, "
                     "choose another directory")
  p = path
  while True:
    if p != path and is_checkpoint_dir(p):
      raise ValueError(f"{what} {out} lies inside the checkpoint directory {p}, where it would "
                       "be taken for a training checkpoint; choose a directory outside it")
    if is_run_dir(p):
      if p == path:
        raise ValueError(f"{what} {out} is a run directory; nothing replaces a run, choose "
                         "another directory")
      if replaces:
        raise ValueError(f"{what} {out} lies inside the run directory {p}: --overwrite never "
                         "replaces anything in a run; remove it yourself or choose another "
                         "directory")
    parent = os.path.dirname(p)
    if parent == p:
      break
    p = parent


def _lock_holder(fd: int) -> int | None:
  """The pid holding a ``flock`` on ``fd``'s file, from ``/proc/locks`` (Linux); else None."""
  st = os.fstat(fd)
  dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
  try:
    with open("/proc/locks") as f:
      for line in f:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 08:01:131 0 EOF" (a blocked waiter has "->").
        if "->" in parts or "FLOCK" not in parts:
          continue
        i = parts.index("FLOCK")
        if len(parts) > i + 4 and parts[i + 4] == dev and parts[i + 3].isdigit():
          return int(parts[i + 3])
  except OSError:
    return None
  return None


class RunLock:
  """An exclusive lock on a run directory for the life of this process (or until ``release``).

  ``acquire`` creates the directory if needed, then takes a non-blocking ``flock`` on it;
  another live holder raises ``RunDirLocked`` naming its pid. Acquiring a directory this
  process already holds is a no-op, so the script and the run loop may both ask.
  """

  _held: dict[str, "RunLock"] = {}

  def __init__(self, run_dir: str):
    self.path = os.path.realpath(run_dir)
    self.fd: int | None = None

  @classmethod
  def acquire(cls, run_dir: str) -> "RunLock":
    lock = cls(run_dir)
    held = cls._held.get(lock.path)
    if held is not None and held.fd is not None:
      return held
    os.makedirs(lock.path, exist_ok=True)
    fd = os.open(lock.path, os.O_RDONLY)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = _lock_holder(fd) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
      os.close(fd)
      if e.errno in _NO_FLOCK:
        warnings.warn(f"the filesystem of {run_dir} does not support flock ({e.strerror}): "
                      "the run directory is not locked against a second writer", stacklevel=2)
        return lock  # unlocked: nothing to release
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
        raise
      who = f"process {holder}" if holder else "another process"
      raise RunDirLocked(f"run directory {run_dir} is in use by {who} (one writer per run "
                         "directory); wait for it to end or choose another run_dir") from None
    lock.fd = fd
    cls._held[lock.path] = lock
    return lock

  def release(self) -> None:
    if self.fd is not None:
      fcntl.flock(self.fd, fcntl.LOCK_UN)
      os.close(self.fd)
      self.fd = None
      RunLock._held.pop(self.path, None)

  def __enter__(self) -> "RunLock":
    return self

  def __exit__(self, *exc) -> None:
    self.release()


class hold_run_dir:
  """``with hold_run_dir(run_dir):`` holds the run directory's lock for the block, releasing it
  after only if the block took it (a lock the caller already held stays held)."""

  def __init__(self, run_dir: str):
    self.run_dir = run_dir
    self.lock: RunLock | None = None

  def __enter__(self) -> RunLock:
    taken = os.path.realpath(self.run_dir) not in RunLock._held
    lock = RunLock.acquire(self.run_dir)
    self.lock = lock if taken else None
    return lock

  def __exit__(self, *exc) -> None:
    if self.lock is not None:
      self.lock.release()
