"""Full-size run directories as the arms of a table: ``read_run`` reads one ``scripts/train.py``
run directory, ``collect_runs`` assigns runs to the arms whose config they equal (outside the
run-local keys) and ``check_identities`` refuses runs of other weights, data or dtypes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Sequence


class RunsError(ValueError):
  """A run directory that cannot enter a table (named in the message)."""


def read_run(run_dir: str) -> dict:
  """One ``scripts/train.py`` run directory: its ``config.json`` and ``metrics.jsonl``.

  Returns {"dir", "config", "identity" (``identity.json``, ``rlpost.train.identity``; None for
  a run older than identities), "evals": [{"step", metric: value}] (the ``eval/`` metrics of its
  entries, in step order), "train": {metric: [value per step]} (the ``train/`` metrics)}.
  """
  try:
    with open(os.path.join(run_dir, "config.json")) as f:
      config = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise RunsError(f"{run_dir}: no readable config.json ({e})") from None
  evals, train = {}, {}
  try:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      entries = [json.loads(line) for line in f if line.strip()]
  except (OSError, json.JSONDecodeError) as e:
    raise RunsError(f"{run_dir}: no readable metrics.jsonl ({e})") from None
  for entry in entries:
    step = entry.get("step")
    for k, v in entry.items():
      if k.startswith("eval/"):
        evals.setdefault(step, {"step": step})[k[5:]] = v
      elif k.startswith("train/"):
        train.setdefault(k[6:], {})[step] = v
  from rlpost.train import identity

  try:
    ident = identity.read(run_dir)
  except ValueError as e:
    raise RunsError(str(e)) from None
  return {"dir": run_dir, "config": config, "identity": ident,
          "evals": [evals[s] for s in sorted(evals)],
          "train": {k: [v[s] for s in sorted(v)] for k, v in train.items()}}


def run_local_keys() -> frozenset:
  """Config keys a run may set differently from its arm: where the weights and data live, how
  the run is laid out on devices and in memory (values unchanged, tested), and operational
  ones; declared with each key (``run_local`` in ``rlpost.train.rl_config.RLConfig``)."""
  from rlpost.train import config as config_lib
  from rlpost.train.rl_config import RLConfig

  return config_lib.keys_where(RLConfig, run_local=True)


def _complete(config: Mapping) -> dict:
  """An RLConfig dict with every default filled in (JSON values), as ``config.json`` holds it."""
  from rlpost.train import config as config_lib
  from rlpost.train import rl

  try:
    cfg = config_lib.from_dict(rl.RLConfig, dict(config))
  except (TypeError, ValueError) as e:
    raise RunsError(f"a config that RLConfig refuses: {e}") from None
  return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _signature(config: Mapping) -> str:
  full = _complete(config)
  local = run_local_keys()
  return json.dumps({k: v for k, v in full.items() if k not in local}, sort_keys=True,
                    default=str)


def collect_runs(runs_dir: str, arms: Mapping[str, dict], *, select=None,
                 min_seeds: int = 2) -> dict:
  """Full-size run directories (any depth below ``runs_dir``) as the arms of a table.

  ``arms``: {arm name: RLConfig dict} (an ``experiments/*/full.py`` ``FULL``). A run belongs to
  the arm whose config it equals on every key outside ``run_local_keys()`` (defaults filled in on
  both sides); its seed is its config's ``seed``. ``select``: the arm names to return (None:
  all); runs of the other arms are recognised and left out. Returns {arm: {"config", "seeds",
  "evals": [{"step", "per_seed": [eval dict per seed]}], "train": {metric: [steps][S]},
  "seconds", "runs"}} (the layout of ``experiments.rl_seeds.run_arm``). Raises ``RunsError``
  naming the directory for a run of no arm, a seed run twice, an unfinished run (its last
  evaluation is not at its last step) or an arm whose seeds disagree on their evaluation steps,
  naming the arm for one with fewer than ``min_seeds`` seeds, and naming the key for runs of
  other weights, data or dtypes (``check_identities``).
  """
  by_sig: dict[str, str] = {}
  for name, c in arms.items():
    by_sig.setdefault(_signature(c), name)
  found: dict[str, dict] = {}
  dirs = sorted(os.path.dirname(p) for p in _find(runs_dir, "config.json"))
  if not dirs:
    raise RunsError(f"--runs {runs_dir}: no run directories (config.json) below it")
  for d in dirs:
    run = read_run(d)
    try:
      name = by_sig.get(_signature(run["config"]))
    except RunsError as e:
      raise RunsError(f"{d}: {e}") from None
    if name is None:
      raise RunsError(f"{d}: its config matches no arm of the table (every key outside "
                      f"runs.run_local_keys() must equal the arm's); arms: "
                      f"{', '.join(arms)}")
    if select is not None and name not in select:
      continue
    steps = run["config"].get("steps")
    if not run["evals"] or run["evals"][-1]["step"] != steps:
      last = run["evals"][-1]["step"] if run["evals"] else None
      raise RunsError(f"{d}: unfinished (last evaluation at step {last}, the run has {steps} "
                      "steps); finish it or leave it out")
    seed = run["config"].get("seed", 0)
    if seed in found.setdefault(name, {}):
      raise RunsError(f"{d}: arm {name} seed {seed} is also in {found[name][seed]['dir']}")
    found[name][seed] = run
  check_identities([r for by_seed in found.values() for r in by_seed.values()],
                   {r["dir"]: n for n, by_seed in found.items() for r in by_seed.values()})
  out = {}
  for name, by_seed in found.items():
    seeds = sorted(by_seed)
    if len(seeds) < min_seeds:
      raise RunsError(f"arm {name}: {len(seeds)} seed(s) under {runs_dir}, the table needs "
                      f">= {min_seeds}")
    runs = [by_seed[s] for s in seeds]
    steps = [[e["step"] for e in r["evals"]] for r in runs]
    for r, st in zip(runs, steps):
      if st != steps[0]:
        raise RunsError(f"{r['dir']}: evaluation steps {st} differ from those of "
                        f"{runs[0]['dir']} ({steps[0]}); align the runs of arm {name}")
    evals = [{"step": st, "per_seed": [r["evals"][i] for r in runs]}
             for i, st in enumerate(steps[0])]
    common = set.intersection(*(set(r["train"]) for r in runs))
    n = min(len(r["train"][k]) for r in runs for k in common) if common else 0
    train = {k: [[r["train"][k][t] for r in runs] for t in range(n)] for k in sorted(common)}
    out[name] = {"config": runs[0]["config"], "seeds": seeds, "evals": evals, "train": train,
                 "seconds": None, "runs": [r["dir"] for r in runs]}
  return out


def check_identities(runs: Sequence[dict], arm_of: Mapping[str, str]) -> None:
  """Every run of a table started from the same weights, read the same data and used the same
  dtypes (``rlpost.train.identity``: digests of what the paths held, since the paths are
  run-local). A run without ``identity.json`` (older than identities) gets the identity of the
  files its config names, when this machine has them. Raises ``RunsError`` naming the key and
  two runs that differ, or a run whose identity cannot be known."""
  from rlpost.train import identity

  known = []
  for r in runs:
    ident = r.get("identity")
    if ident is None:
      try:
        ident = identity.of_config(r["config"])
      except OSError as e:
        raise RunsError(f"{r['dir']}: no {identity.FILE} (a run older than run identities), and "
                        f"its files are not here to digest ({e}); rerun it, or copy its policy "
                        "and data to the paths its config.json names") from None
    known.append((r["dir"], ident))
  first_dir, first = known[0] if known else (None, None)
  for d, ident in known[1:]:
    for key in identity.differences(first, ident):
      raise RunsError(
          f"runs differ in '{key}': {first_dir} (arm {arm_of.get(first_dir)}) has "
          f"{identity.describe(first, key)}, {d} (arm {arm_of.get(d)}) has "
          f"{identity.describe(ident, key)}; a table pools runs of one policy, one data set and "
          "one dtype")


def _find(root: str, filename: str) -> list[str]:
  hits = []
  for d, _, files in os.walk(root):
    if filename in files:
      hits.append(os.path.join(d, filename))
  return hits
