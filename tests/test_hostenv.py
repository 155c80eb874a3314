"""rlpost.hostenv: a command restarts itself once with glibc's huge-page tunable, keeping its
arguments, and leaves everything alone when opted out or already tuned."""

import os
import subprocess
import sys

from rlpost import hostenv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = """
import os, sys
sys.path.insert(0, {root!r})
from rlpost import hostenv
print("start", os.getpid(), flush=True)
hostenv.reexec()
print("args", sys.argv[1:], "pid", os.getpid(), "tunables", os.environ.get("GLIBC_TUNABLES", ""))
"""


def _run(env_updates):
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostenv.OPT_OUT)}
  env.update(env_updates)
  out = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT), "a", "--b"], env=env,
                       capture_output=True, text=True, check=True).stdout
  starts = [ln for ln in out.splitlines() if ln.startswith("start")]
  (last,) = [ln for ln in out.splitlines() if ln.startswith("args")]
  return starts, last


def test_reexec_adds_the_tunable_once_and_keeps_arguments_and_pid():
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostenv.OPT_OUT)}
  starts, last = _run({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
  assert "args ['a', '--b']" in last
  pid = starts[0].split()[1]
  assert f"pid {pid} " in last  # exec keeps the process
  if hostenv.wanted(env):
    assert len(starts) == 2  # started again, once
    assert last.endswith("tunables glibc.malloc.arena_max=4:" + hostenv.TUNABLE)
  else:  # this host has no glibc >= 2.35 or no transparent huge pages: nothing changes
    assert len(starts) == 1 and last.endswith("tunables glibc.malloc.arena_max=4")


def test_opted_out_or_already_tuned_runs_once():
  for env in ({hostenv.OPT_OUT: "0"}, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}):
    starts, last = _run(env)
    assert len(starts) == 1, env
    assert last.endswith("tunables " + env.get("GLIBC_TUNABLES", "")), (env, last)


def test_environment_appends_to_other_tunables():
  assert hostenv.environment({})["GLIBC_TUNABLES"] == hostenv.TUNABLE
  got = hostenv.environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"})
  assert got == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:" + hostenv.TUNABLE, "X": "1"}
  assert not hostenv.wanted({"GLIBC_TUNABLES": hostenv.TUNABLE})
  assert not hostenv.wanted({hostenv.OPT_OUT: "0"})
