"""A pytest plugin that logs each test's memory, for finding what a test session holds.

  RLPOST_MEMLOG_DIR=/tmp/memlog python -m pytest -n 2 -p scripts.pytest_memlog

Every process of the session (the controller and each xdist worker) writes
``mem_<worker>.log``: a ``START`` line per test, then an ``END`` line with the process's
resident memory (``rss``) and its peak so far (``hwm``), in MiB, from /proc/self/status.
It also sends the fatal-signal tracebacks of all threads to ``fault_<worker>.log``, so a
worker that dies leaves its last stacks on disk. Without RLPOST_MEMLOG_DIR it does nothing.
"""

import faulthandler
import os
import time

ENV = "RLPOST_MEMLOG_DIR"
_files = {}


def _memory_mib() -> dict:
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(("VmRSS:", "VmHWM:")):
        key, value = line.split(":")
        out[key] = int(value.split()[0]) // 1024
  return out


def pytest_sessionstart(session):
  directory = os.environ.get(ENV)
  if not directory:
    return
  os.makedirs(directory, exist_ok=True)
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  _files["fault"] = open(os.path.join(directory, f"fault_{worker}.log"), "w")
  faulthandler.enable(file=_files["fault"], all_threads=True)
  _files["mem"] = open(os.path.join(directory, f"mem_{worker}.log"), "w", buffering=1)


def pytest_runtest_logstart(nodeid, location):
  if "mem" in _files:
    _files["mem"].write(f"{time.time():.0f} START {nodeid}\n")


def pytest_runtest_logfinish(nodeid, location):
  if "mem" in _files:
    m = _memory_mib()
    _files["mem"].write(f"{time.time():.0f} END {nodeid} rss={m.get('VmRSS')} "
                        f"hwm={m.get('VmHWM')}\n")
