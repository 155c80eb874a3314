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
numbers: paired comparisons between arms are sharper). Seeds share their step-0 parameters, so the
step-0 evaluation runs once per arm.

``arm_units`` makes each arm a ``harness.Unit`` (one vmapped seed block), which the harness caches
by the arm's config and seeds, so a rerun of an experiment trains only the missing arms. The
tables' analyses beside the arms sample the SFT policy here too: ``sample_rows``, the fresh-group
sign flips of recipes' advantages (``fresh_group_sign_flips``, with the testbed's rewards from
``arithmetic_rewards``) and the advantage mass by group accuracy (``advantage_mass``).
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlpost import objectives as O
from rlpost.tasks import arithmetic
from rlpost.train import rl

# The toy setup of every RL experiment's ``--quick`` mode: a tiny policy on 1-2 digit addition.
# It trains its own tiny SFT start (no pinned testbed: ``init_params`` "").
QUICK_BASE = dict(num_train=200, num_test=40, eval_problems=0, init_params="", sft_steps=10,
                  sft_batch_size=32,
                  eval_batch=64,
                  task_spec=dict(min_digits=1, max_digits=2, terms=2),
                  model=dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64))
# The RL tables' ``--quick`` start: a longer SFT that solves some problems (as the learning fixture
# of tests/rl_testutil.py), so that rewards differ within groups and from a prompt's reference.
QUICK_SFT = dict(QUICK_BASE, sft_steps=400, sft_lr=3e-3)

# Per-step training metrics kept in the results (all seeds).
TRAIN_KEYS = ("reward", "accuracy", "loss", "zero_variance_groups", "adv_abs", "truncated",
              "response_length", "logp_mismatch", "grad_norm", "kl", "entropy",
              "overconfident_errors", "confidence_shift", "shift_wrong_p10", "shift_wrong_p50",
              "shift_wrong_p90", "penalty_share_overconfident", "dars_all_wrong_stage1",
              "dars_rescued",
              "dars_extra_rollouts", "dars_budget_used", "kept_groups")


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


def run_arm(cfg: dict, seeds: list[int], *, eval_kwargs: dict | None = None,
            on_step: Callable[[int], None] | None = None,
            log: Callable[[str], None] = lambda s: None) -> dict:
  """Train ``cfg`` (an RLConfig dict) for each seed; evaluate at step 0, every ``eval_every``
  steps and at the end.

  Returns {"config", "seeds", "train": {metric: [steps][S] list}, "evals": [per eval point:
  {"step", "per_seed": [eval dict per seed]}], "seconds", "compilations"}.
  """
  t0 = time.perf_counter()
  trainer = rl.make_train(cfg, log=log)
  states = stack_states(trainer, seeds)
  step_fn = vmapped_step(trainer, states)
  eval_kwargs = eval_kwargs or {}

  def evaluate(step):
    per_seed = [trainer.evaluate(unstack(states.params, i), **eval_kwargs)
                for i in range(len(seeds))]
    return {"step": step, "per_seed": per_seed}

  # Every seed starts from the same parameters and the evaluation key is fixed, so step 0 is one
  # evaluation shared by all seeds.
  start = trainer.evaluate(unstack(states.params, 0), **eval_kwargs)
  evals = [{"step": 0, "per_seed": [dict(start) for _ in seeds]}]
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
  return {"config": cfg, "seeds": list(seeds), "train": {k: v for k, v in train.items() if v},
          "evals": evals, "seconds": time.perf_counter() - t0,
          "compilations": trainer.num_traces}


def arm_units(cfgs: dict, seeds: list[int]) -> dict:
  """{arm name: harness.Unit} training each RLConfig dict of ``cfgs`` over ``seeds``."""
  from experiments import harness

  return {name: harness.Unit({"arm": cfg, "seeds": list(seeds)},
                             lambda progress, cfg=cfg: run_arm(cfg, list(seeds), on_step=progress),
                             cfg["steps"])
          for name, cfg in cfgs.items()}


def sample_rows(trainer: rl.Trainer, idx: np.ndarray, key, chunk: int = 2048):
  """Completions of the reference policy for prompts ``idx`` [R] (tokens and masks [R, T]),
  sampled ``chunk`` rows at a time (the last chunk padded: one compilation)."""
  sample = jax.jit(trainer.sample)
  r = len(idx)
  full = np.concatenate([idx, np.zeros(-r % chunk, idx.dtype)])
  toks, masks = [], []
  for i, k in enumerate(jax.random.split(key, len(full) // chunk)):
    ro = sample(trainer.ref_params, jnp.asarray(full[i * chunk:(i + 1) * chunk]), k)
    toks.append(np.asarray(ro.tokens))
    masks.append(np.asarray(ro.mask))
  return np.concatenate(toks)[:r], np.concatenate(masks)[:r]


def fresh_group_sign_flips(trainer: rl.Trainer, recipes: Mapping[str, tuple[str, dict, int]],
                           gs: Sequence[int], rewards: Mapping[str, Callable], *, prompts: int,
                           reference: int, pool: int, seed: int = 0) -> dict:
  """Sign flips of recipes' small-group advantages on the reference policy, over fresh groups
  (``objectives.fresh_group_sign_flips``). For each of the first ``prompts`` training prompts,
  ``reference`` completions give the reference baseline b (the prompt's mean reward); a separate
  pool of ``pool`` completions is cut into disjoint groups of G + ``extra`` rollouts, scored by
  the advantage of recipe ``recipes[name] = (recipe, args, extra)``, for each G of ``gs``.
  ``rewards``: {kind: fn(tokens, mask, prompt idx) -> [R] rewards}, each scoring the same
  samples. Returns {kind: {name: {G: SignFlipRates.to_json()}}}."""
  k_ref, k_pool, k_adv = jax.random.split(jax.random.key(seed), 3)
  ref_idx = np.repeat(np.arange(prompts, dtype=np.int32), reference)
  pool_idx = np.repeat(np.arange(prompts, dtype=np.int32), pool)
  ref, fresh = sample_rows(trainer, ref_idx, k_ref), sample_rows(trainer, pool_idx, k_pool)
  out = {}
  for kind, reward in rewards.items():
    b = np.asarray(reward(*ref, ref_idx)).reshape(prompts, reference).mean(axis=1)
    r = np.asarray(reward(*fresh, pool_idx)).reshape(prompts, pool)
    out[kind] = {name: {g: O.fresh_group_sign_flips(O.get_recipe(recipe, **args).advantage, r, b,
                                                    g + extra, key=k_adv).to_json() for g in gs}
                 for name, (recipe, args, extra) in recipes.items()}
  return out


def arithmetic_rewards(trainer: rl.Trainer) -> dict:
  """{"binary", "graded"}: the arithmetic task's 0/1 and graded rewards of completions of the
  trainer's training prompts, each fn(tokens, mask, prompt idx) -> [R] rewards (the ``rewards``
  of ``fresh_group_sign_flips``)."""
  data = trainer.train_data

  def reward(graded: bool):
    return lambda tokens, mask, idx: arithmetic.reward(
        jnp.asarray(tokens), jnp.asarray(mask), data.answer[idx], data.answer_len[idx],
        trainer.tok, graded=graded)[0]

  return {"binary": reward(False), "graded": reward(True)}


def advantage_mass(trainer: rl.Trainer, recipes: Mapping[str, Mapping], prompts: int, n: int,
                   *, seed: int = 0) -> dict:
  """The cumulative |advantage| of a group (the sum of |A_i| over its ``n`` rollouts) against the
  group's accuracy, on the reference policy: the first ``prompts`` training prompts x ``n``
  rollouts, scored by the advantage of each recipe ``name`` with arguments ``recipes[name]``.
  Returns {"accuracy": the levels j / n, "groups": the groups at each level, name: the mean
  cumulative |A| of those groups (nan at a level without groups)}."""
  idx = jnp.repeat(jnp.arange(prompts, dtype=jnp.int32), n)
  ro = jax.jit(trainer.sample)(trainer.ref_params, idx, jax.random.key(seed))
  batch = O.RolloutBatch(group_id=idx, valid=jnp.ones((prompts * n,), bool), tokens=ro.tokens,
                         token_mask=ro.mask, rewards=ro.rewards)
  acc = np.asarray(ro.correct).reshape(prompts, n).mean(axis=1)
  at = [np.isclose(acc, j / n) for j in range(n + 1)]
  out = {"accuracy": [j / n for j in range(n + 1)], "groups": [int(np.sum(m)) for m in at]}
  for name, args in recipes.items():
    adv, _ = O.compute_advantages(O.get_recipe(name, **args).advantage, batch)
    cum = np.abs(np.asarray(adv.values)).reshape(prompts, n).sum(axis=1)
    out[name] = [float(cum[m].mean()) if np.any(m) else float("nan") for m in at]
  return out


def final_metric(arm: dict, key: str = "pass@1") -> np.ndarray:
  """[S] the metric at the last evaluation of each seed."""
  return np.array([e[key] for e in arm["evals"][-1]["per_seed"]])
