"""An ``Experiment`` whose units ``harness.run_units`` runs in worker processes (``--jobs``):
units that report where they ran, fail, or kill their process, and one RL arm on the learning
fixture. Worker processes import it by name (``EXPERIMENT``), so it lives on the tests' path."""

from __future__ import annotations

import os
import time

import numpy as np

from experiments import harness


def where(progress, pause: float) -> dict:
  time.sleep(pause)  # long enough that both workers take a unit
  progress(1)
  return {"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)),
          "tunables": os.environ.get("GLIBC_TUNABLES"), "values": np.arange(3.0)}


def fail(progress) -> dict:
  raise ValueError("the unit's own error")


def die(progress) -> dict:
  os._exit(3)


def arm(progress, cfg: dict) -> dict:
  from experiments import rl_seeds

  return rl_seeds.run_arm(cfg, [0, 1], on_step=progress)


def units(config: dict) -> dict:
  out = {}
  for uid, kind in config["units"].items():
    if kind == "where":
      run = lambda p: where(p, config.get("pause", 1.0))  # noqa: E731
    elif kind == "fail":
      run = fail
    elif kind == "die":
      run = die
    else:
      run = lambda p: arm(p, config["arm"])  # noqa: E731
    out[uid] = harness.Unit({"uid": uid, "kind": kind, "arm": config.get("arm")}, run,
                            weight=config.get("weights", {}).get(uid, 1))
  return out


EXPERIMENT = harness.Experiment(name="jobs_fixture", get_config=lambda quick: {}, units=units,
                                summarize=lambda r: {}, render=lambda r: "",
                                module="jobs_fixture", pinned=False)
