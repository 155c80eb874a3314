"""The committed starting points of the paper tables (pinned testbeds).

A table that starts from a trained policy loads it from a file committed here,
``<name>-<digest>.npz`` (``rlpost.train.pinned``: the digest is a hash of the weights, checked on
every load), instead of retraining it on each machine: the same SFT config and seed gave pass@1
0.255 on one host and 0.158 on another, and the tables' verdicts moved with it.

``RECIPES`` says how each testbed was trained (an RLConfig dict whose SFT warm start is the
testbed); ``PINNED`` names the digest the tables load. ``python scripts/testbed.py build NAME``
retrains a testbed from its recipe, writes a new file beside the old one with a manifest
(recipe, machine, commit) and prints its digest; the tables move to it only when ``PINNED`` is
edited, which changes every unit's cache key, so a table never mixes units of two starts.
"""

from __future__ import annotations

import os

from experiments.grpo_arithmetic import CONFIG

DIR = os.path.dirname(os.path.abspath(__file__))

# How each testbed is trained: the SFT warm start of these RLConfig dicts.
RECIPES = {
    # The calibrated GRPO testbed (experiments/calibrate.py): the 0.4M-parameter character
    # decoder SFT-trained 500 steps on 2-3 digit addition. ACE, DARS, MC-GRPO and averaging_rl
    # start here.
    "b23-sft": dict(CONFIG, task_spec=dict(min_digits=2, max_digits=3, terms=2), sft_steps=500),
}

# The digest of each testbed the tables load (experiments/testbeds/<name>-<digest>.npz).
PINNED = {
    "b23-sft": "2fd651497158c750",
}


def path(name: str) -> str:
  """The committed file of testbed ``name`` (KeyError naming the known ones)."""
  if name not in PINNED:
    raise KeyError(f"no pinned testbed {name!r}; known: {sorted(PINNED)}")
  return os.path.join(DIR, f"{name}-{PINNED[name]}.npz")


def start(name: str) -> dict:
  """The RLConfig keys that start a run from testbed ``name``: the pinned file, no SFT."""
  return {"init_params": os.path.relpath(path(name), _root()), "sft_steps": 0}


def _root() -> str:
  return os.path.dirname(os.path.dirname(DIR))


def digest_of(config: dict) -> str:
  """The testbed digest an RLConfig dict starts from ("" when it trains its own start)."""
  from rlpost.train import pinned

  p = config.get("init_params") or ""
  return pinned.parse_name(p)[1] if p else ""
