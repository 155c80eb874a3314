"""Metrics of two RL steps of every recipe (and allocation / memory option) on the test suite's
learning fixture policy, to check that a refactor changes no number.

    python scripts/recipe_fingerprint.py before.json          # on the old commit
    python scripts/recipe_fingerprint.py after.json --compare before.json

``--compare`` prints, per arm, the largest relative difference of any step metric and any
evaluation number, and exits 1 if a metric appeared, disappeared or differs by more than
``--rtol`` (default 0: bitwise, the contract for the same program on the same machine).
``--allow-new`` lists metrics only this run reports (a change that adds metrics) without
failing; every number of the reference must still be there and agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

ARMS = {
    "grpo": {}, "dr_grpo": dict(recipe="dr_grpo"), "dapo": dict(recipe="dapo"),
    "dapo_ds2": dict(recipe="dapo", allocation="dynamic_sampling",
                     allocation_args=dict(factor=2)),
    "gspo": dict(recipe="gspo"),
    "gspo_token": dict(recipe="gspo_token"), "pnpo": dict(recipe="pnpo"),
    "rloo": dict(recipe="rloo"), "mc_grpo": dict(recipe="mc_grpo", group_size=5),
    "ace": dict(recipe="ace", recipe_args={"alpha": 0.5}),
    "dars_et": dict(recipe="dars", allocation="dars",
                    allocation_args=dict(schedule="et", n_max=8, budget=16)),
    "dars_hw": dict(recipe="dars", allocation="dars",
                    allocation_args=dict(schedule="hw", n_max=8, budget=16)),
    "grpo_iters": dict(num_iterations=2, num_minibatches=2),
    "grpo_accum": dict(grad_accum=2),
}


def fingerprint(arms: dict) -> dict:
  import numpy as np
  from rl_testutil import learning_config

  from rlpost.train import rl

  d = tempfile.mkdtemp()
  dirs = dict(data_dir=os.path.join(d, "data"), cache_dir=os.path.join(d, "cache"))
  out = {}
  for name, kw in arms.items():
    tr = rl.make_train(learning_config(dirs, **kw), log=lambda s: None)
    state = tr.init_state()
    steps = []
    for _ in range(2):
      state, m = tr.step(state)
      steps.append({k: float(np.asarray(v)) for k, v in m.items() if np.ndim(v) == 0})
    ev = tr.evaluate(state.params, num_problems=8, num_samples=4)
    out[name] = dict(steps=steps, eval={k: float(v) for k, v in ev.items()})
    print(name, {k: steps[-1][k] for k in ("reward", "loss", "grad_norm")}, flush=True)
  return out


def compare(a: dict, b: dict, rtol: float, allow_new: bool = False) -> bool:
  ok = True
  for arm in b:
    if arm not in a:
      print(f"{arm}: not in the reference")
      ok = False
      continue
    worst = 0.0
    pairs = [(f"step {i + 1} {k}", x.get(k), y.get(k))
             for i, (x, y) in enumerate(zip(a[arm]["steps"], b[arm]["steps"]))
             for k in set(x) | set(y)]
    pairs += [(f"eval {k}", a[arm]["eval"].get(k), b[arm]["eval"].get(k))
              for k in set(a[arm]["eval"]) | set(b[arm]["eval"])]
    for what, x, y in pairs:
      if x is None or y is None:
        print(f"{arm}: {what} only in {'the reference' if y is None else 'this run'}")
        ok = ok and (x is None and allow_new)
        continue
      d = abs(x - y) / max(abs(x), 1e-12) if x != y else 0.0
      worst = max(worst, d)
      if d > rtol:
        ok = False
    print(f"{arm:12s} max relative difference {worst:.3g}")
  return ok


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("out", help="JSON file to write")
  p.add_argument("--compare", help="a reference JSON written by this script")
  p.add_argument("--rtol", type=float, default=0.0)
  p.add_argument("--allow-new", action="store_true",
                 help="metrics only this run reports are listed, not failures")
  args = p.parse_args(argv)
  result = fingerprint(ARMS)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  if args.compare:
    with open(args.compare) as f:
      return 0 if compare(json.load(f), result, args.rtol, args.allow_new) else 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
