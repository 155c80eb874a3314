"""The committed starting points and datasets of the paper tables (pinned testbeds).

A table that starts from a trained policy, or reads a generated dataset, loads it from a file
committed here, ``<name>-<digest>.npz`` (``rlpost.train.pinned``: the digest is a hash of the
arrays, checked on every load), instead of making it again on each machine: the same SFT config
and seed gave pass@1 0.255 on one host and 0.158 on another, and the tables' verdicts moved
with it.

Two kinds: ``RECIPES`` says how each trained start was made (an RLConfig dict whose SFT warm start
is the testbed), ``DATA`` how each generated dataset was made (the round-trip tables' systems,
``rlpost.dynamics.data.load_all``: four splits integrated in float64 by a pseudo-spectral solver,
stored as float32 ``{split: [N, T, X, F]}``). ``PINNED`` names the digest the tables load.
``python scripts/testbed.py build NAME`` makes a testbed again from its recipe, writes a new file
beside the old one with a manifest (recipe, machine, commit) and prints its digest; the tables
move to it only when ``PINNED`` is edited, which changes their units' cache keys, so a table
never mixes units of two starts or of two datasets of one system.
"""

from __future__ import annotations

import os

import numpy as np

from experiments.grpo_arithmetic import CONFIG

DIR = os.path.dirname(os.path.abspath(__file__))

# How each testbed is trained: the SFT warm start of these RLConfig dicts.
RECIPES = {
    # The calibrated GRPO testbed (experiments/calibrate.py): the 0.4M-parameter character
    # decoder SFT-trained 500 steps on 2-3 digit addition. ACE, DARS, MC-GRPO and averaging_rl
    # start here.
    "b23-sft": dict(CONFIG, task_spec=dict(min_digits=2, max_digits=3, terms=2), sft_steps=500),
}

# The round-trip tables' datasets (experiments/roundtrip loads them instead of integrating the
# systems again): load_all's keyword arguments, at its default split sizes.
DATA = {
    "kdv1d-data0": dict(system_name="kdv1d", seed=0, num_train=128, num_val=32, num_test=32,
                        num_ood=32),
    "ks1d-data0": dict(system_name="ks1d", seed=0, num_train=128, num_val=32, num_test=32,
                       num_ood=32),
}

# The digest of each testbed the tables load (experiments/testbeds/<name>-<digest>.npz).
PINNED = {
    "b23-sft": "2fd651497158c750",
    "kdv1d-data0": "1efba6329d272c95",
    "ks1d-data0": "5edfb9101ab9c842",
}


def names() -> list[str]:
  """Every testbed with a recipe, trained starts and datasets."""
  return sorted({*RECIPES, *DATA})


def build(name: str, log=print, progress: bool = False):
  """Testbed ``name`` made again from its recipe, never from a cache: the SFT-trained policy's
  parameters, or the dataset's splits (KeyError naming the known testbeds)."""
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    if name in RECIPES:
      from rlpost.train import config as config_lib
      from rlpost.train import rl, setup

      cfg = config_lib.from_dict(rl.RLConfig, dict(RECIPES[name], cache_dir=tmp))
      return setup.character_start(cfg, log, progress=progress)
    if name in DATA:
      from rlpost.dynamics import data as data_lib

      return data_lib.load_all(data_dir=tmp, **DATA[name])
  raise KeyError(f"no testbed {name!r}; known: {names()}")


def like(name: str):
  """The structure, shapes and dtypes a file of testbed ``name`` must have (for
  ``pinned.load``): the recipe's model at its initialisation, or the dataset's split shapes."""
  if name in RECIPES:
    from rlpost.train import config as config_lib
    from rlpost.train import rl, setup

    cfg = config_lib.from_dict(rl.RLConfig, dict(RECIPES[name], sft_steps=0))
    return setup.character_start(cfg, lambda s: None, progress=False)
  if name in DATA:
    import jax
    import numpy as np

    from rlpost.dynamics import systems

    r = DATA[name]
    system = systems.get_system(r["system_name"])
    frame = (system.num_frames, *system.spatial_shape, system.num_fields)
    counts = {"train": "num_train", "validation": "num_val", "test": "num_test", "ood": "num_ood"}
    return {split: jax.ShapeDtypeStruct((r[n], *frame), np.float32) for split, n in counts.items()}
  raise KeyError(f"no testbed {name!r}; known: {names()}")


def load(name: str):
  """The pinned testbed ``name``, its digest checked (``rlpost.train.pinned.load``)."""
  from rlpost.train import pinned

  return pinned.load(path(name), like(name))


def dataset_file(system: str, seed: int) -> str:
  """The pinned dataset of ``system`` at data seed ``seed`` as a path relative to the
  repository ("" when none is pinned)."""
  name = f"{system}-data{seed}"
  return os.path.relpath(path(name), _root()) if name in DATA and name in PINNED else ""


def dataset(system: str, seed: int) -> tuple[str, dict] | None:
  """(``dataset_file``, ``{split: float32 [N, T, X, F]}``) of the pinned dataset of ``system``
  at data seed ``seed``, its digest checked, or None when none is pinned."""
  from rlpost.dynamics import data as data_lib

  file = dataset_file(system, seed)
  if not file:
    return None
  splits = load(f"{system}-data{seed}")
  return file, {k: np.asarray(splits[k]) for k in data_lib.SPLITS}


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
