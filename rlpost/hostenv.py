"""Process settings that XLA:CPU's speed depends on, applied when a command starts.

XLA:CPU allocates a program's temporaries with ``malloc`` at every execution and frees them
after it. Blocks that large come from fresh ``mmap`` pages, so every execution faults its
whole temporary buffer in again, 4 KiB page by page, and the kernel zeroes each page. The GRPO
update of ``bench.py train`` has 635 MB of temporaries: 157,000 minor page faults and 0.22 s of
system time per update, 40% of its 0.54 s wall time (``scripts/benchmarks/dot_in_step.py``,
BENCHMARKS.md "Page faults in the update"). The dots inside the update looked 2-4x slower than
the same dots alone for this reason: they were the first to write their freshly mapped outputs.

glibc's tunable ``glibc.malloc.hugetlb=1`` makes ``malloc`` ask for transparent huge pages
(``madvise``) on what it maps: 512 times fewer faults. Tunables are read only when a process
starts, so ``reexec()`` starts the command again, once, with the tunable added to
``GLIBC_TUNABLES``: the same interpreter, arguments (``sys.orig_argv``) and process id. It does
nothing when the tunable is already set (a re-executed or child process), off Linux / glibc
< 2.35, when the kernel's transparent huge pages are off, or with ``RLPOST_HOST_TUNABLES=0``.
Only the ``if __name__ == "__main__"`` block of a command calls it (never an import), before
any backend starts; numbers are unchanged (only where memory comes from).
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "RLPOST_HOST_TUNABLES"
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _glibc_with_hugetlb() -> bool:
  name, version = platform.libc_ver()
  try:
    major, minor = (int(x) for x in version.split(".")[:2])
  except ValueError:
    return False
  return name == "glibc" and (major, minor) >= (2, 35)


def _thp_usable() -> bool:
  """Transparent huge pages are on for ``madvise``d memory (``[always]`` or ``[madvise]``)."""
  try:
    with open(THP) as f:
      mode = f.read()
  except OSError:
    return False
  return "[always]" in mode or "[madvise]" in mode


def wanted(environ=None) -> bool:
  """Whether ``reexec`` would start this command again with the tunable."""
  environ = os.environ if environ is None else environ
  return (environ.get(OPT_OUT, "1") != "0"
          and "glibc.malloc.hugetlb" not in environ.get("GLIBC_TUNABLES", "")
          and sys.platform == "linux" and _glibc_with_hugetlb() and _thp_usable())


def environment(environ=None) -> dict:
  """``environ`` with ``TUNABLE`` added to its ``GLIBC_TUNABLES`` (kept: any other tunables)."""
  environ = dict(os.environ if environ is None else environ)
  tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
  environ["GLIBC_TUNABLES"] = ":".join([*tunables, TUNABLE])
  return environ


def reexec() -> None:
  """Start this command again with ``TUNABLE`` when ``wanted()``; otherwise return."""
  if not wanted():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment())
