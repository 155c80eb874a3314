"""The averaging sweep: every (learning rate, schedule, seed) run trained side by side in one
jitted, vmapped program, with the in-training averages carried in the state.

Shape legend: R runs (learning rates x schedules x seeds), B batch, T = 64 tokens, K LAWA window,
E eval points (every ``eval_every`` steps), C checkpoints kept for post-hoc averaging, M the
in-training methods (index 0 the raw parameters). Every evaluation gives the excess loss and the
expected next-token accuracy (``lm.excess_loss``, ``lm.expected_accuracy``).

One call of the jitted ``block`` advances all R runs by ``eval_every`` optimizer steps (a
``lax.scan``) and evaluates the raw parameters and every in-training average on the held-out
set; the host loop over blocks keeps a progress bar and copies the raw parameters and the two
power-EMA states out as checkpoints (in memory) for the post-hoc methods (MWA, EDM2
reconstruction), which then run through ``rlpost.averaging``'s post-hoc API.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.averaging import lm
from rlpost import averaging as A
from rlpost import progress as progress_lib


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  lrs: tuple = (1e-3, 3e-3, 1e-2, 3e-2)
  decay_lrs: tuple = (3e-3, 1e-2)  # the arm with cosine decay to 10% of the peak
  seeds: int = 8  # from power: stats.seeds_needed(pilot_sd, min_effect), floor min_seeds
  pilot_sd: float = 0.0041
  min_effect: float = 0.01
  min_seeds: int = 8
  steps: int = 1000
  warmup: int = 50
  batch: int = 32
  eval_every: int = 50
  eval_seqs: int = 64
  corpus_seqs: int = 16384
  weight_decay: float = 0.01
  b2: float = 0.99
  grad_clip: float = 1.0
  # averaging
  lawa_k: int = 5
  lawa_nus: tuple = (10, 25, 50, 100)
  lawa_main_nu: int = 50
  ema_decays: tuple = (0.9, 0.98, 0.995, 0.998)  # plus the decay lag-matched to the main LAWA
  swa_every: int = 10
  power_sigma_rels: tuple = (0.05, 0.10)
  posthoc_sigma_rels: tuple = (0.02, 0.05, 0.075, 0.10, 0.15, 0.20)
  mwa_penalties: tuple = (1.0, 2.0, 4.0, 8.0)
  mwa_step_penalties: tuple = (1.0, 2.0, 4.0)
  mwa_last: int = 10  # MWA merges the last mwa_last checkpoints (and, exploratory, all of them)
  mwa_p: float = 8.0  # the pre-declared penalty of the MWA claims (loss^-p)
  model: lm.ModelConfig = lm.ModelConfig(layers=1, hidden=64, mlp=128)
  language_seed: int = 0
  seed_offset: int = 0  # the first seed (a replication runs seeds the table did not use)

  @property
  def lag_matched_decay(self) -> float:
    return A.ema_lag_matched_decay(self.lawa_main_nu * (self.lawa_k - 1) / 2)

  def runs(self) -> list[dict]:
    out = []
    for sched, lrs in (("constant", self.lrs), ("cosine", self.decay_lrs)):
      for lr in lrs:
        for s in range(self.seed_offset, self.seed_offset + self.seeds):
          out.append({"lr": float(lr), "schedule": sched, "seed": s})
    return out


def quick_config() -> SweepConfig:
  """A toy-size sweep for ``--quick`` and the tests: seconds, not minutes."""
  return SweepConfig(lrs=(3e-3, 3e-2), decay_lrs=(), seeds=2, steps=120, warmup=10, batch=8,
                     eval_every=20, eval_seqs=8, corpus_seqs=512, lawa_nus=(5, 20),
                     lawa_main_nu=20, lawa_k=3, ema_decays=(0.9,), swa_every=5,
                     posthoc_sigma_rels=(0.05, 0.1), mwa_penalties=(2.0,), mwa_step_penalties=(1.0,),
                     mwa_last=3, mwa_p=2.0, min_seeds=2,
                     model=lm.ModelConfig(layers=1, hidden=16, heads=2, mlp=32))


def method_names(cfg: SweepConfig) -> list[str]:
  return list(_transforms(cfg))


def _transforms(cfg: SweepConfig) -> dict:
  ts = {f"lawa_nu{nu}": A.lawa(cfg.lawa_k, every=nu) for nu in cfg.lawa_nus}
  for d in cfg.ema_decays:
    ts[f"ema_{d:g}"] = A.ema(d)
  ts["ema_lag"] = A.ema(cfg.lag_matched_decay)
  ts["swa"] = A.swa(every=cfg.swa_every)
  ts["swa_late"] = A.swa(start=cfg.steps // 2, every=cfg.swa_every)
  for s in cfg.power_sigma_rels:
    ts[f"power_{s:g}"] = A.power_ema(s)
  return ts


def _lr_at(step, peak, cosine, cfg: SweepConfig):
  """Linear warm-up to ``peak``, then constant, or cosine to 10% of the peak when ``cosine``."""
  s = step.astype(jnp.float32)
  warm = jnp.minimum(1.0, (s + 1.0) / cfg.warmup)
  frac = jnp.clip((s - cfg.warmup) / max(cfg.steps - cfg.warmup, 1), 0.0, 1.0)
  cos = 0.1 + 0.9 * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
  return peak * warm * jnp.where(cosine, cos, 1.0)


def run_sweep(cfg: SweepConfig, *, progress: bool = True, log=print, on_block=None) -> dict:
  """Train every run and evaluate the averages. Returns host arrays and metadata.

  ``on_block(1)`` is called after each block of ``eval_every`` steps (a progress callback)."""
  t_start = time.perf_counter()
  lang = lm.make_language(cfg.model.vocab, seed=cfg.language_seed)
  rng = np.random.default_rng(cfg.language_seed + 1)
  corpus = jnp.asarray(lm.sample(lang, cfg.corpus_seqs, cfg.model.seq_len, rng))
  eval_x = lm.sample(lang, cfg.eval_seqs, cfg.model.seq_len, np.random.default_rng(10_000))
  eval_p = jnp.asarray(lm.true_next_probs(lang, eval_x))
  eval_x = jnp.asarray(eval_x)
  runs = cfg.runs()
  lr = jnp.asarray([r["lr"] for r in runs], jnp.float32)
  cosine = jnp.asarray([r["schedule"] == "cosine" for r in runs])
  seeds = jnp.asarray([r["seed"] for r in runs], jnp.int32)
  mcfg = cfg.model
  tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), optax.scale_by_adam(b2=cfg.b2))
  avg = A.named(**_transforms(cfg))
  names = list(_transforms(cfg))
  power_names = [f"power_{s:g}" for s in cfg.power_sigma_rels]

  def evaluate(p):  # [2]: excess loss (nats), expected next-token accuracy
    return jnp.stack([lm.excess_loss(mcfg, p, eval_x, eval_p),
                      lm.expected_accuracy(mcfg, p, eval_x, eval_p)])

  def init(seed):
    key = jax.random.key(seed)
    p = lm.init_params(mcfg, jax.random.fold_in(key, 0))
    return dict(params=p, opt=tx.init(p), avg=avg.init(p), step=jnp.int32(0),
                key=jax.random.key_data(jax.random.fold_in(key, 1)))

  def one_block(carry, lr_peak, is_cos):
    def step(c, _):
      key = jax.random.wrap_key_data(c["key"])
      idx = jax.random.randint(jax.random.fold_in(key, c["step"]), (cfg.batch,), 0,
                               corpus.shape[0])
      loss, g = jax.value_and_grad(lambda p: lm.train_loss(mcfg, p, corpus[idx]))(c["params"])
      u, opt = tx.update(g, c["opt"], c["params"])
      eta = _lr_at(c["step"], lr_peak, is_cos, cfg)
      params = jax.tree.map(lambda p, d: p - eta * (d + cfg.weight_decay * p), c["params"], u)
      c = dict(c, params=params, opt=opt, step=c["step"] + 1, avg=avg.update(params, c["avg"]))
      return c, loss

    carry, losses = jax.lax.scan(step, carry, None, length=cfg.eval_every)
    results = avg.result(carry["avg"], carry["params"])
    ev = jnp.stack([evaluate(carry["params"])] + [evaluate(results[n]) for n in names])  # [M, 2]
    snaps = {"raw": carry["params"], **{n: carry["avg"][n].ema for n in power_names}}
    return carry, (ev, jnp.mean(losses), snaps)

  block = jax.jit(jax.vmap(one_block), donate_argnums=0)
  evaluate_many = jax.jit(jax.vmap(evaluate))
  carry = jax.jit(jax.vmap(init))(seeds)
  n_blocks = cfg.steps // cfg.eval_every
  evals, train_loss, snapshots = [], [], []
  bar = progress_lib.bar(range(n_blocks), desc="averaging sweep", disable=not progress)
  t_compile = None
  for b in bar:
    carry, (ev, tl, snaps) = block(carry, lr, cosine)
    ev = np.asarray(ev)
    if t_compile is None:
      t_compile = time.perf_counter() - t_start
    evals.append(ev)
    train_loss.append(np.asarray(tl))
    snapshots.append(jax.tree.map(np.asarray, snaps))
    bar.set_postfix(raw=f"{ev[:, 0, 0].mean():.3f}")
    if on_block:
      on_block(1)
  steps = [(b + 1) * cfg.eval_every for b in range(n_blocks)]
  ev = np.stack(evals, 1)  # [R, E, M, 2]
  out = {
      "runs": runs, "methods": ["raw"] + names, "steps": steps,
      "evals": ev[..., 0],  # [R, E, M] excess loss (nats)
      "evals_acc": ev[..., 1],  # [R, E, M] expected next-token accuracy
      "bayes_accuracy": lm.bayes_accuracy(np.asarray(eval_p)),
      "train_loss": np.stack(train_loss, 1),  # [R, E] mean training loss of each block
      "entropy_floor": lang.entropy_floor, "num_params": lm.num_params(
          jax.tree.map(lambda x: x[0], carry["params"])),
  }
  t_train = time.perf_counter() - t_start
  out.update(_posthoc(cfg, snapshots, steps, out["train_loss"], evaluate_many, progress))
  out["seconds"] = {"compile_and_first_block": t_compile, "train_and_eval": t_train,
                    "total": time.perf_counter() - t_start}
  return out


def _stack_runs(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _posthoc(cfg, snapshots, steps, train_loss, evaluate_many, progress) -> dict:
  """Post-hoc methods over the in-memory checkpoints through ``rlpost.averaging.average``.

  A checkpoint here holds all R runs stacked on a leading axis, so a plan whose weights do not
  depend on the run (post-hoc EMA, step-weighted MWA) averages every run in one pass; loss-weighted
  MWA has one plan per run.
  """
  n_runs = train_loss.shape[0]
  ck = {s: snapshots[i] for i, s in enumerate(steps)}
  gammas = {f"power_{s:g}": A.sigma_rel_to_gamma(s) for s in cfg.power_sigma_rels}

  def load_all(item):
    step, name = item if isinstance(item, tuple) else (item, "raw")
    return ck[step][name]

  def load_run(run):
    return lambda item: jax.tree.map(lambda x: x[run], load_all(item))

  out = {}
  # EDM2: reconstruct each width at every eval step from the two tracked profiles' snapshots.
  ph = np.zeros((2, n_runs, len(steps), len(cfg.posthoc_sigma_rels)))
  for j, t in enumerate(progress_lib.bar(steps, desc="post-hoc EMA", disable=not progress)):
    items = [(s, n) for s in steps if s <= t for n in gammas]
    for i, sr in enumerate(cfg.posthoc_sigma_rels):
      plan = A.plan_posthoc_ema(items, gammas, sr, target_step=t)
      ph[:, :, j, i] = np.asarray(evaluate_many(A.average(load_all, plan))).T
  out["posthoc_ema"], out["posthoc_ema_acc"] = ph[0], ph[1]
  out["posthoc_sigma_rels"] = list(cfg.posthoc_sigma_rels)
  # MWA over the last ``mwa_last`` checkpoints ("last_" keys) and, exploratory, over all of them,
  # weighted by the mean training loss of the block before each checkpoint, or by its step.
  mwa, mwa_acc = {}, {}
  for tag, sl in (("last_", slice(-cfg.mwa_last, None)), ("", slice(None))):
    kept = steps[sl]
    for p in (0.0,) + tuple(cfg.mwa_penalties):
      params = [A.average(load_run(r), A.plan_mwa(kept, p, metric=list(train_loss[r][sl])))
                for r in range(n_runs)]
      ev = np.asarray(evaluate_many(_stack_runs(params)))
      mwa[f"{tag}loss_p{p:g}"], mwa_acc[f"{tag}loss_p{p:g}"] = ev[:, 0], ev[:, 1]
    for p in cfg.mwa_step_penalties:
      ev = np.asarray(evaluate_many(A.average(load_all, A.plan_mwa(kept, p, weight_fn="step"))))
      mwa[f"{tag}step_p{p:g}"], mwa_acc[f"{tag}step_p{p:g}"] = ev[:, 0], ev[:, 1]
  out["mwa"], out["mwa_acc"] = mwa, mwa_acc
  out["mwa_weights_run0"] = {
      f"last_loss_p{p:g}": list(A.plan_mwa(steps[-cfg.mwa_last:], p,
                                           metric=list(train_loss[0][-cfg.mwa_last:])).weights)
      for p in (0.0,) + tuple(cfg.mwa_penalties)}
  return out
