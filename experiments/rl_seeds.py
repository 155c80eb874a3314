"""Run every seed of one experimental arm as one vmapped, jitted RL program.

A paper table at CPU scale needs many small runs: arms x seeds. Seeds of one arm share every
shape, so ``jax.vmap`` over a stacked ``RLState`` trains them side by side in one program (the
purejaxrl pattern): one compilation per arm, and larger, more efficient matrix products than one
seed at a time. Seeds share the cached SFT policy and the data; they differ in the PRNG key that
drives sampling, advantages and mini-batches. Each seed's run is the same function of
(config, seed) as ``rl.Trainer.step`` would compute (up to float reassociation in batched
kernels), so the trainer's tests cover it.

Evaluation uses the trainer's ``evaluate`` on each seed's parameters with a fixed evaluation key,
so every arm and seed is scored on the same problems with the same sampling noise (common random
numbers: paired comparisons between arms are sharper).

Results of a finished arm are cached as JSON under ``cache_dir`` keyed by the arm's config and
seeds, so a rerun of the experiment skips them (resumable).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.train import rl

# The toy setup of every RL experiment's ``--quick`` mode: a tiny policy on 1-2 digit addition.
QUICK_BASE = dict(num_train=200, num_test=40, eval_problems=0, sft_steps=10, sft_batch_size=32,
                  eval_batch=64,
                  task_spec=dict(min_digits=1, max_digits=2, terms=2),
                  model=dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64))

# Per-step training metrics kept in the results (all seeds).
TRAIN_KEYS = ("reward", "accuracy", "loss", "zero_variance_groups", "adv_abs", "truncated",
              "response_length", "logp_mismatch", "grad_norm", "kl", "entropy",
              "overconfident_errors", "confidence_shift", "dars_all_wrong_stage1", "dars_rescued",
              "dars_extra_rollouts", "kept_groups")


def arm_key(cfg: dict, seeds: list[int], extra: dict | None = None) -> str:
  blob = json.dumps({"cfg": cfg, "seeds": list(seeds), "extra": extra or {}}, sort_keys=True,
                    default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stack_states(trainer: rl.Trainer, seeds: list[int]) -> rl.RLState:
  """[S, ...] initial states, identical except for the PRNG key derived from each seed."""
  base = trainer.init_state()
  states = [base._replace(key=jax.random.key_data(jax.random.key(s))) for s in seeds]
  return jax.device_put(jax.tree.map(lambda *x: jnp.stack(x), *states), jax.devices()[0])


def vmapped_step(trainer: rl.Trainer, states: rl.RLState):
  """The trainer's step over stacked seeds, jitted so the output keeps the input shardings (one
  compilation for the whole run, as ``Trainer.step``)."""
  return trainer.vmapped_step(states)


def unstack(tree, i: int):
  return jax.tree.map(lambda x: x[i], tree)


def run_arm(cfg: dict, seeds: list[int], *, cache_dir: str | None = None,
            eval_kwargs: dict | None = None, on_step: Callable[[int], None] | None = None,
            log: Callable[[str], None] = lambda s: None) -> dict:
  """Train ``cfg`` (an RLConfig dict) for each seed; evaluate at step 0, every ``eval_every``
  steps and at the end.

  Returns {"config", "seeds", "train": {metric: [steps][S] list}, "evals": [per eval point:
  {"step", "per_seed": [eval dict per seed]}], "seconds", "compilations"}.
  """
  key = arm_key(cfg, seeds, eval_kwargs)
  path = os.path.join(cache_dir, f"arm-{key}.json") if cache_dir else None
  if path and os.path.exists(path):
    with open(path) as f:
      out = json.load(f)
    if on_step:
      on_step(cfg["steps"])
    log(f"reusing finished arm {path}")
    return out
  t0 = time.perf_counter()
  trainer = rl.make_train(cfg, log=log)
  states = stack_states(trainer, seeds)
  step_fn = vmapped_step(trainer, states)
  eval_kwargs = eval_kwargs or {}

  def evaluate(step):
    per_seed = [trainer.evaluate(unstack(states.params, i), **eval_kwargs)
                for i in range(len(seeds))]
    return {"step": step, "per_seed": per_seed}

  evals = [evaluate(0)]
  train = {k: [] for k in TRAIN_KEYS}
  steps = cfg["steps"]
  for step in range(1, steps + 1):
    states, metrics = step_fn(states)
    metrics = jax.device_get(metrics)
    for i, s in enumerate(seeds):
      try:
        rl.raise_if_bad({k: v[i] for k, v in metrics.items()}, step)
      except FloatingPointError as e:
        raise FloatingPointError(f"seed {s}: {e}") from None
    for k in TRAIN_KEYS:
      if k in metrics:
        train[k].append([float(v) for v in np.asarray(metrics[k])])
    if step % cfg["eval_every"] == 0 or step == steps:
      evals.append(evaluate(step))
    if on_step:
      on_step(1)
  out = {"config": cfg, "seeds": list(seeds), "train": {k: v for k, v in train.items() if v},
         "evals": evals, "seconds": time.perf_counter() - t0,
         "compilations": trainer.num_traces}
  if path:
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(out, f)
    os.replace(tmp, path)
  return out


def diff_ci_unpaired(a, b, n_boot: int = 10000, seed: int = 0) -> dict:
  """Mean of ``a`` minus mean of ``b`` (independent arms) with a 95% bootstrap interval that
  resamples each arm's seeds; {"mean", "lo", "hi", "n", "signed"}."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if min(a.size, b.size) < 2:
    return {"mean": float(a.mean() - b.mean()), "lo": float("nan"), "hi": float("nan"), "n": 1,
            "signed": True}
  rng = np.random.default_rng(seed)
  d = (a[rng.integers(0, a.size, (n_boot, a.size))].mean(1)
       - b[rng.integers(0, b.size, (n_boot, b.size))].mean(1))
  return {"mean": float(a.mean() - b.mean()), "lo": float(np.quantile(d, 0.025)),
          "hi": float(np.quantile(d, 0.975)), "n": int(min(a.size, b.size)), "signed": True}


def final_metric(arm: dict, key: str = "pass@1") -> np.ndarray:
  """[S] the metric at the last evaluation of each seed."""
  return np.array([e[key] for e in arm["evals"][-1]["per_seed"]])
