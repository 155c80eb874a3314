"""MC-GRPO at CPU scale, on the calibrated GRPO testbed: median vs mean baselines at G=2.

Paper: "MC-GRPO: Median-Centered Group Relative Policy Optimization" (official code
lotusroot-kim/MC-GRPO). Claims checked: (1) with the median baseline over G+1 rollouts the
G=2 accuracy comes within 1% of G=8's; (2) at G=2 the median beats the mean baseline over G,
(3) an unbiased same-compute control (mean over G+1, a uniformly random rollout dropped) and
(4) the official same-compute ablation (mean over G+1, the rollout with the smallest |r|
dropped); (5) the mechanism: small-group mean baselines give advantages of the wrong sign, the
median fewer.

Command:  python scripts/reproduce.py mc_grpo [--quick] [--seeds N] [--out DIR]
Hardware: 2 CPU cores. Setup (pre-declared in ``Sizes`` before the run): the calibrated testbed
of ``experiments/calibrate.py`` (setting ``b23-lr1e-4-kl0-p64``: 2-3 digit addition, the
0.4M-parameter character decoder SFT-started on that band, 64 prompts per step, AdamW lr 1e-4,
no KL, 100 steps) with the **graded** reward (the one under which a baseline can give an
opposite-sign advantage; under 0/1 rewards it can only give zero). Arms: GRPO at G=8 (the
target), and at G=2: GRPO (mean over G), MC-GRPO (median over G+1 with MAD scaling, the pivot
dropped, and the official GSM trainer's rescale of non-zero advantages by (G+1)/n_nonzero,
which that trainer applies with the median), the official ablation (mean and std over G+1,
smallest |r| dropped: under 0/1 rewards always a failure when the group has one, so it is a
success-biased sample, not a neutral control) and the unbiased control (mean and std over G+1,
a uniformly random rollout dropped). Seeds of an arm run as one vmapped program
(``experiments/rl_seeds.py``). Secondary table (``Sizes.binary_secondary``): the same five arms,
recipes (the rescale included), seeds and claims on the 0/1 reward, with their own gate and Holm
families (claim ids ending in "_01"). Other bases (``Sizes.bases``): the mean and median
baselines at G=2 over DAPO and over Dr.GRPO (graded reward, no KL, the median arms rescaled), for
the paper's "orthogonal to the base" claim, each base's own mean arm gated on learning.

Primary metric (pre-declared): test pass@1 (300 problems x 8 samples at temperature 1), the mean
of each seed's last 3 evaluations (steps 60, 80, 100). Seeds: 8 per arm, from
``stats.seeds_needed`` at the pilot SD (0.0078, pooled over the calibration's final G=8 and G=2
arms, 0/1 reward) and the pre-declared minimum effect 0.0125 (half the calibrated G=8 - G=2 gap,
0.025), floor 8. The G=2 to G=8 gap closed by the median, (median - mean) / (G8 - mean) at G=2,
is reported with a BCa interval (independent resampling of each arm's seeds). The base method
must learn: GRPO's G=8 and G=2 gains over the SFT start are judged first (their own family);
the variant claims are read only if both are reproduced. The sign-flip rates are measured on
the SFT policy with a 64-sample reference per prompt and fresh groups (completions not among
those that made the reference).

The paper's own setup at full size (accelerators, not run here): ``experiments/mc_grpo/full.py``.

Outputs in ``--out`` (default ``results/mc_grpo``): ``table.md``, ``results.json``,
``learning_curves.png``, ``sign_flips.png``; finished arms are cached under ``cache/`` and not
rerun.

The numbers this table last produced are in ``results/mc_grpo/table.md``, and copied into the
results section of ``experiments/mc_grpo/README.md`` by ``experiments/docsync.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments import harness, rl_seeds, rl_table
from rlpost import objectives as O
from rlpost.eval import stats
from rlpost.tasks import arithmetic
from rlpost.train import rl

BASELINES = ("mean", "median", "mean_drop", "mean_random")
LABELS = {"mean": "mean over G (GRPO)", "median": "median over G+1 (MC-GRPO)",
          "mean_drop": "mean over G+1, smallest |r| dropped (official ablation)",
          "mean_random": "mean over G+1, random rollout dropped (unbiased control)"}
METRIC = "pass@1"  # per seed: the mean of the last ``window`` evaluations
BINARY = "01-"  # arm-name prefix of the secondary table's arms (0/1 reward)
GAP_MARGIN = 0.01  # the paper's "within 1%"


@dataclasses.dataclass(frozen=True)
class Sizes(rl_table.Design):
  """The pre-declared design. Defaults on 2 CPU cores: ~18 minutes per table of five arms (the
  graded table and the 0/1 secondary), ~14 for the four arms over other bases: ~50 minutes."""

  eval_problems: int = 300
  eval_samples: int = 8
  pilot_sd: float = 0.0078
  min_effect: float = 0.0125
  small_g: int = 2
  large_g: int = 8
  flip_prompts: int = 200  # sign-flip analysis: prompts x reference samples, fresh pool
  flip_reference: int = 64
  flip_pool: int = 144
  binary_secondary: bool = True  # the same arms on the 0/1 reward: the secondary table
  bases: tuple = ("dapo", "dr_grpo")  # MC-GRPO over other bases, at G=small_g, graded reward
  # The primary table's reward: "graded", or "binary" for runs trained on a two-valued reward
  # (a full-size MATH table), whose claims are then the 0/1 family's.
  primary_reward: str = "graded"


def primary_family(sz: Sizes) -> str:
  return "mc_grpo_01" if sz.primary_reward == "binary" else "mc_grpo"


def sizes(quick: bool) -> Sizes:
  if not quick:
    return Sizes()
  # An SFT start that solves some problems (as the learning fixture of tests/rl_testutil.py),
  # so that the sign-flip analysis has rewards that differ from their prompt's reference.
  tiny = dict(rl_seeds.QUICK_BASE, num_prompts=4, eval_batch=32, sft_steps=400, sft_lr=3e-3,
              task_spec=dict(min_digits=1, max_digits=2, terms=2))
  return Sizes(seeds=2, steps=3, eval_every=1, window=2, eval_problems=8, eval_samples=4,
               large_g=4, min_seeds=2, flip_prompts=8, flip_reference=8, flip_pool=12,
               base=tiny)


def seeds_from_power(sz: Sizes) -> int:
  return max(sz.min_seeds, stats.seeds_needed(sz.pilot_sd, sz.min_effect))


def base_config(sz: Sizes, *, graded: bool = True) -> dict:
  """The testbed's RLConfig dict: graded reward (the primary table) or 0/1 (the secondary)."""
  from experiments import calibrate

  cfg = calibrate.testbed_config("b23-lr1e-4-kl0-p64")
  cfg.update(graded_reward=graded, steps=sz.steps, eval_every=sz.eval_every,
             eval_problems=sz.eval_problems, eval_samples=sz.eval_samples,
             checkpoint_every=10 ** 9)
  cfg.update(sz.base)
  return cfg


def arm_config(base: dict, g: int, baseline: str, *, kl_coef: float | None = None,
               rescale: bool = False, recipe: str = "grpo") -> dict:
  """The RLConfig dict of one arm (G is the number of gradient-contributing rollouts).

  ``kl_coef``: the recipes' KL coefficient (None: theirs, 0.04); ``rescale``: the median arm
  multiplies non-zero advantages by (G+1) / n_nonzero (the official GSM trainer's rule);
  ``recipe``: the base ("grpo", "dapo", "dr_grpo"; the mean and median baselines only)."""
  args = {} if kl_coef is None else {"kl_coef": kl_coef}
  if recipe != "grpo":
    if baseline not in ("mean", "median"):
      raise ValueError(f"baseline {baseline!r} is only run over the GRPO base")
    args = dict(args, base=recipe) if baseline == "median" else args
  if baseline == "mean":
    return dict(base, recipe=recipe, group_size=g, recipe_args=args)
  if baseline == "median":
    return dict(base, recipe="mc_grpo", group_size=g + 1,
                recipe_args=dict(args, rescale=True) if rescale else args)
  if baseline in ("mean_drop", "mean_random"):
    kind = "mean" if baseline == "mean_drop" else "mean_random"
    return dict(base, recipe="mc_grpo", group_size=g + 1, recipe_args=dict(args, baseline=kind))
  raise ValueError(f"unknown baseline {baseline!r}")


def arm_names(sz: Sizes, prefix: str = "") -> dict:
  """{arm name: (G, baseline)}: the G=8 target, then every baseline at G=2; ``prefix``
  ``BINARY`` names the secondary table's arms."""
  out = {f"{prefix}G{sz.large_g}-mean": (sz.large_g, "mean")}
  out.update({f"{prefix}G{sz.small_g}-{bl}": (sz.small_g, bl) for bl in BASELINES})
  return out


BASE_LABELS = {"dapo": "DAPO", "dr_grpo": "Dr.GRPO"}


def base_arm_names(sz: Sizes) -> dict:
  """{arm name: (base recipe, baseline)}: the mean and median baselines at G=small_g over each
  of ``sz.bases``."""
  return {f"{b}-G{sz.small_g}-{bl}": (b, bl) for b in sz.bases for bl in ("mean", "median")}


def base_claims(sz: Sizes) -> list[harness.Claim]:
  """The paper's "orthogonal to the base" claim, one per base (family "mc_grpo_bases"), gated
  on each base's mean arm gaining over the SFT start (family "testbed")."""
  g0, out = sz.small_g, []
  for b in sz.bases:
    out.append(harness.Claim(f"{b}_learns_small_g", f"{BASE_LABELS[b]} at G={g0} gains over "
                             "the SFT start", "gain", (f"{b}-G{g0}-mean",), family="testbed"))
  for b in sz.bases:
    out.append(harness.Claim(f"median_beats_mean_over_{b}", f"over {BASE_LABELS[b]}, the median "
                             f"beats the mean baseline at G={g0}", METRIC,
                             (f"{b}-G{g0}-median", f"{b}-G{g0}-mean"), family="mc_grpo_bases",
                             sesoi=sz.min_effect))
  return out


def claims(sz: Sizes, prefix: str = "") -> list[harness.Claim]:
  """The testbed gate (family "testbed"; one-sample claims about the gain over the SFT start,
  filled in by ``summarize``) and the paper's claims about trained arms (family "mc_grpo").

  ``prefix`` ``BINARY``: the same claims about the secondary table's arms (0/1 reward), ids
  ending in "_01", family "mc_grpo_01"; ``summarize`` judges them as their own gate and family.
  A design whose primary table is on a two-valued reward (``primary_reward`` "binary") gets
  the "_01" ids and family for its primary arms too.
  """
  g0, g1 = sz.small_g, sz.large_g
  binary = bool(prefix) or sz.primary_reward == "binary"
  tag, fam = ("_01", "mc_grpo_01") if binary else ("", "mc_grpo")
  a = lambda name: prefix + name  # noqa: E731
  return [
      harness.Claim("grpo_learns_large_g" + tag, f"GRPO at G={g1} gains over the SFT start",
                    "gain", (a(f"G{g1}-mean"),), family="testbed"),
      harness.Claim("grpo_learns_small_g" + tag, f"GRPO at G={g0} gains over the SFT start",
                    "gain", (a(f"G{g0}-mean"),), family="testbed"),
      harness.Claim("gap_within_1pct" + tag, f"the median at G={g0} comes within 1% of G={g1}",
                    METRIC, (a(f"G{g1}-mean"), a(f"G{g0}-median")), "equivalent", GAP_MARGIN,
                    fam),
      harness.Claim("median_beats_mean_small_g" + tag,
                    f"median beats the mean baseline at G={g0}", METRIC,
                    (a(f"G{g0}-median"), a(f"G{g0}-mean")), family=fam, sesoi=sz.min_effect),
      harness.Claim("median_beats_random_drop_small_g" + tag,
                    f"median beats the unbiased same-compute control at G={g0}", METRIC,
                    (a(f"G{g0}-median"), a(f"G{g0}-mean_random")), family=fam,
                    sesoi=sz.min_effect),
      harness.Claim("median_beats_min_abs_drop_small_g" + tag,
                    f"median beats the official same-compute ablation at G={g0}", METRIC,
                    (a(f"G{g0}-median"), a(f"G{g0}-mean_drop")), family=fam,
                    sesoi=sz.min_effect),
  ]


def rate_claim(sz: Sizes) -> harness.Claim:
  """The mechanism claim, about opposite-sign rates pooled over rollouts (not over seeds)."""
  g0 = sz.small_g
  return harness.Claim("median_fewer_sign_flips",
                       "the median gives fewer opposite-sign advantages (graded reward)",
                       "opposite-sign rate, graded reward", (f"median G={g0}", f"mean G={g0}"),
                       "less")


# ------------------------------------------------------------------------------- sign flips
FLIP_RECIPES = {"mean": ("grpo", {}, 0), "median": ("mc_grpo", {}, 1),
                "mean_drop": ("mc_grpo", {"baseline": "mean"}, 1),
                "mean_random": ("mc_grpo", {"baseline": "mean_random"}, 1)}


def _sample_rows(trainer: rl.Trainer, idx: np.ndarray, key, chunk: int = 2048):
  """Completions of prompts ``idx`` [R] in fixed-size chunks (one compilation)."""
  sample = jax.jit(trainer.sample)
  r = len(idx)
  pad = -r % chunk
  full = np.concatenate([idx, np.zeros(pad, idx.dtype)])
  toks, masks = [], []
  for i, k in enumerate(jax.random.split(key, len(full) // chunk)):
    ro = sample(trainer.ref_params, jnp.asarray(full[i * chunk:(i + 1) * chunk]), k)
    toks.append(np.asarray(ro.tokens))
    masks.append(np.asarray(ro.mask))
  return np.concatenate(toks)[:r], np.concatenate(masks)[:r]


def sign_flip_rates(trainer: rl.Trainer, sz: Sizes, *, seed: int = 0) -> dict:
  """Opposite-sign, zeroed and correct-sign advantage rates of small-group baselines on the
  SFT policy.

  For each of ``flip_prompts`` training prompts, ``flip_reference`` completions give the
  reference baseline b (the prompt's mean reward: its expected reward, estimated); a separate
  pool of ``flip_pool`` fresh completions is cut into disjoint groups of G (mean) or G+1
  (MC-GRPO's variants), each scored by the library's own recipe. A rollout's reference
  advantage is r - b; rollouts left out of the loss (pivots, dropped members) and rollouts
  with r = b are not counted. Returned per reward kind ("binary", "graded") and baseline:
  {G: {"opposite", "zeroed", "correct", "count"}}.
  """
  n, m, pool = sz.flip_prompts, sz.flip_reference, sz.flip_pool
  data = trainer.train_data
  k_ref, k_pool, k_adv = jax.random.split(jax.random.key(seed), 3)
  ref_idx = np.repeat(np.arange(n, dtype=np.int32), m)
  pool_idx = np.repeat(np.arange(n, dtype=np.int32), pool)
  ref = _sample_rows(trainer, ref_idx, k_ref)
  fresh = _sample_rows(trainer, pool_idx, k_pool)
  out = {}
  for kind in ("binary", "graded"):
    def rewards(tokens, mask, idx):
      r, _ = arithmetic.reward(jnp.asarray(tokens), jnp.asarray(mask), data.answer[idx],
                               data.answer_len[idx], trainer.tok, graded=kind == "graded")
      return np.asarray(r)

    b = rewards(*ref, ref_idx).reshape(n, m).mean(axis=1)
    r_pool = rewards(*fresh, pool_idx).reshape(n, pool)
    res = {}
    for baseline, (name, args, extra) in FLIP_RECIPES.items():
      recipe = O.get_recipe(name, **args)
      res[baseline] = {}
      for g in (sz.small_g, sz.large_g):
        size = g + extra
        per = pool // size
        rew = r_pool[:, :per * size].reshape(-1)
        batch = O.RolloutBatch(
            group_id=jnp.asarray(np.arange(n * per).repeat(size), jnp.int32),
            valid=jnp.ones(rew.shape, bool), tokens=jnp.zeros((rew.size, 1), jnp.int32),
            token_mask=jnp.ones((rew.size, 1), bool), rewards=jnp.asarray(rew, jnp.float32))
        adv, _ = O.compute_advantages(recipe.advantage, batch, key=k_adv)
        flips = O.sign_flip_rates(adv.values, batch.rewards,
                                  jnp.asarray(np.repeat(b, per * size), jnp.float32),
                                  adv.weights > 0)
        opp, zero = float(flips.opposite), float(flips.zeroed)
        count = int(flips.count)
        res[baseline][g] = {"opposite": opp, "zeroed": zero,
                            "correct": 1.0 - opp - zero if count else 0.0, "count": count}
    out[kind] = res
  return out


# ---------------------------------------------------------------------------------- running
def get_config(quick: bool) -> dict:
  return dataclasses.asdict(sizes(quick))


def _sizes(config: dict) -> Sizes:
  return Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})


def units(config: dict) -> dict:
  sz = _sizes(config)
  base = base_config(sz)
  cfgs = {name: arm_config(base, g, bl, kl_coef=0.0, rescale=True)
          for name, (g, bl) in arm_names(sz).items()}
  if sz.binary_secondary:  # the same arms and recipes, only the reward differs
    binary = base_config(sz, graded=False)
    cfgs.update({name: arm_config(binary, g, bl, kl_coef=0.0, rescale=True)
                 for name, (g, bl) in arm_names(sz, BINARY).items()})
  cfgs.update({name: arm_config(base, sz.small_g, bl, kl_coef=0.0, rescale=True, recipe=b)
               for name, (b, bl) in base_arm_names(sz).items()})
  out = rl_seeds.arm_units(cfgs, list(range(sz.seed_offset, sz.seed_offset + sz.seeds)))
  small = cfgs[f"G{sz.small_g}-mean"]
  out["sign_flips"] = harness.Unit(
      {"sign_flips": small, "sizes": config, "design": "fresh groups"},
      lambda progress: sign_flip_rates(rl.make_train(small, log=lambda s: None), sz))
  return out


def from_full_runs(runs_dir: str, prefix: str) -> tuple[dict, dict]:
  """Full-size runs of ``experiments/mc_grpo/full.py`` (one dataset: ``prefix`` "math-" or
  "gsm8k-") as this table's config and data; the sign-flip analysis is CPU-only."""
  full_size = importlib.import_module("experiments.mc_grpo.full")
  from experiments.full_size import power_fields

  if prefix not in ("math-", "gsm8k-"):
    raise harness.RunsError(f"mc_grpo --full: --prefix must be 'math-' or 'gsm8k-' (one "
                            f"dataset per table), got {prefix!r}")
  sz = Sizes(binary_secondary=False, bases=())
  wanted = {prefix + n for n in arm_names(sz)}
  runs = {k[len(prefix):]: v
          for k, v in harness.collect_runs(runs_dir, full_size.FULL, select=wanted).items()}
  missing = [n for n in arm_names(sz) if n not in runs]
  if missing:
    raise harness.RunsError(f"mc_grpo --full: no runs under {runs_dir} for arm(s) "
                            f"{', '.join(prefix + n for n in missing)}")
  cfg = runs[f"G{sz.small_g}-median"]["config"]
  big = runs[f"G{sz.large_g}-mean"]["config"]
  seeds = {n: len(runs[n]["seeds"]) for n in arm_names(sz)}
  # Every run matched its arm's config, graded_reward included, and a dataset's arms share it.
  sz = dataclasses.replace(sz, primary_reward="graded" if cfg.get("graded_reward") else "binary")
  reward = "graded" if sz.primary_reward == "graded" else "0/1"
  sz = dataclasses.replace(
      sz, **power_fields(), seeds=min(seeds.values()), steps=cfg["steps"],
      eval_every=cfg["eval_every"],
      eval_problems=cfg["eval_problems"], eval_samples=cfg["eval_samples"],
      setting=f"full size, {prefix[:-1]} (experiments/mc_grpo/full.py: {cfg['task']}, "
              f"{cfg['num_prompts']} prompts per step at G={sz.small_g}, "
              f"{big['num_prompts']} prompts x {big['steps']} steps at G={sz.large_g}, lr "
              f"{cfg['lr']:g}, {reward} reward (claim family {primary_family(sz)})"
              + ("" if len(set(seeds.values())) == 1 else
                 f"; seeds per arm {seeds}, the header gives the fewest")
              + ")")
  return dataclasses.asdict(sz), {"arms": {n: runs[n] for n in arm_names(sz)}}


def collect(config: dict, results: dict) -> dict:
  return {"arms": {k: v for k, v in results.items() if k != "sign_flips"},
          "sign_flips": results["sign_flips"]}


def _flips(report: dict) -> dict | None:
  """The sign-flip rates with integer G keys (JSON keeps them as strings); None for full-size
  runs (the analysis samples from the CPU SFT policy)."""
  if "sign_flips" not in report["data"]:
    return None
  return {k: {bl: {int(g): v for g, v in d.items()} for bl, d in r.items()}
          for k, r in report["data"]["sign_flips"].items()}


def primary(arm: dict, window: int) -> np.ndarray:
  """[S] the mean of each seed's last ``window`` evaluations (step 0 excluded)."""
  evals = arm["evals"][1:][-window:]
  return np.array([[e["per_seed"][i][METRIC] for e in evals]
                   for i in range(len(arm["seeds"]))]).mean(axis=1)


# ---------------------------------------------------------------------------------- summary
def _gated_cells(results: dict, names, claim_list, window: int, start: float) -> dict:
  """Per-arm cells (primary metric, gain over ``start``, final evaluation, seconds) of the arms
  ``names`` and the gated verdicts of ``claim_list``; "prim" holds the per-seed values."""
  prim = {name: primary(results[name], window) for name in names}
  judged, learned = harness.judge_gated(claim_list, {"gain": prim, METRIC: prim}, start=start,
                                        table="mc_grpo")
  return {"prim": prim, "cells": {n: harness.cell(v) for n, v in prim.items()},
          "gains": {n: harness.cell(v - start) for n, v in prim.items()},
          "final_eval": {n: harness.cell(rl_seeds.final_metric(results[n], METRIC))
                         for n in names},
          "arm_seconds": {n: results[n]["seconds"] for n in names},
          "base_learned": learned, "claims": [v.to_json() for v in judged],
          "verdicts": {v.claim.id: v.verdict for v in judged}}


def _judge_table(results: dict, sz: Sizes, prefix: str = "") -> dict:
  """One table's cells, differences, gap fraction and gated verdicts, over the arms of
  ``arm_names(sz, prefix)``."""
  names = arm_names(sz, prefix)
  first = results[next(iter(names))]["evals"][0]["per_seed"]
  start = float(np.mean([e[METRIC] for e in first]))
  t = _gated_cells(results, names, claims(sz, prefix), sz.window, start)
  prim = t.pop("prim")
  g0, g1 = f"{prefix}G{sz.small_g}", f"{prefix}G{sz.large_g}"
  return {"start_pass@1": start, **t,
          "vs": {bl: harness.diff_cell(prim[f"{g0}-median"], prim[f"{g0}-{bl}"])
                 for bl in BASELINES if bl != "median"},
          "gap": harness.diff_cell(prim[f"{g1}-mean"], prim[f"{g0}-mean"]),
          "gap_closed": rl_table.gap_fraction(prim[f"{g0}-mean"], prim[f"{g0}-median"],
                                     prim[f"{g1}-mean"])}


def summarize(report: dict) -> dict:
  results, flips, sz = report["data"]["arms"], _flips(report), _sizes(report["config"])
  g0 = sz.small_g
  s = _judge_table(results, sz)
  s["seeds_from_power"] = seeds_from_power(sz)
  s["binary"] = None
  if sz.binary_secondary:
    s["binary"] = _judge_table(results, sz, BINARY)
    s["verdicts"].update(s["binary"]["verdicts"])
    s["arm_seconds"].update(s["binary"]["arm_seconds"])
  s["bases"] = None
  if sz.bases:
    s["bases"] = _gated_cells(results, base_arm_names(sz), base_claims(sz), sz.window,
                              s["start_pass@1"])
    del s["bases"]["prim"]
    s["verdicts"].update(s["bases"]["verdicts"])
    s["arm_seconds"].update(s["bases"]["arm_seconds"])
  s["rates"] = None
  if flips is not None:
    graded = flips["graded"]
    s["rates"] = harness.judge_proportions(rate_claim(sz), {
        f"{bl} G={g0}": (graded[bl][g0]["opposite"], graded[bl][g0]["count"])
        for bl in ("median", "mean")})
    s["verdicts"][s["rates"]["claim"]["id"]] = s["rates"]["verdict"]
  return s


def _setting(sz: Sizes) -> str:
  from experiments import calibrate

  if sz.setting:
    return sz.setting
  return (f"{calibrate.describe(base_config(sz))}, no KL"
          + ("; the same arms on the 0/1 reward as a secondary table" if sz.binary_secondary
             else ""))


def render(report: dict) -> str:
  s, flips, sz = report["summary"], _flips(report), _sizes(report["config"])
  g0, g1 = sz.small_g, sz.large_g
  fam = primary_family(sz)
  mdes = [c["mde"] for c in s["claims"] if c["claim"]["family"] == fam]
  lines = [
      "# MC-GRPO at full size" if report.get("full") else "# MC-GRPO at CPU scale", "",
      f"`{report['command']}`: {harness.seeds_note(sz, s['seeds_from_power'])}, {sz.steps} RL steps, {_setting(sz)}. Primary metric: test "
      f"pass@1 ({sz.eval_problems} "
      f"problems x {sz.eval_samples} samples), the mean of each seed's last {sz.window} "
      f"evaluations. SFT start: {s['start_pass@1']:.3f}. Minimum detectable effect of the "
      f"variant claims: {min(mdes):.3f}-{max(mdes):.3f}. {harness.wall_time(report)} "
      "Cells: mean [95% t interval over seeds]; differences: Welch intervals. Intervals exclude "
      "problem-sampling error (every arm is evaluated on the same fixed test problems with the "
      "same evaluation key).", "",
      "## Primary metric", ""]
  if s.get("binary"):
    lines += ["The secondary table trains the same arms with the same recipes on the 0/1 "
              "reward (1 for an exact answer, else 0), where a baseline can zero an advantage "
              "but never flip its sign; its SFT start is the same policy "
              f"({s['binary']['start_pass@1']:.3f}).", ""]
  lines += ["| reward | arm | pass@1 (last-3 mean) | gain over SFT | final evaluation | "
            "minutes |", "| --- | --- | --- | --- | --- | --- |"]
  label = "0/1" if sz.primary_reward == "binary" else "graded"
  tables = [(label, "", s)] + ([("0/1", BINARY, s["binary"])] if s.get("binary") else [])
  for reward, prefix, t in tables:
    for name, (g, bl) in arm_names(sz, prefix).items():
      lines.append(f"| {reward} | G={g}, {LABELS[bl]} | {harness.fmt(t['cells'][name])} | "
                   f"{harness.fmt(t['gains'][name])} | {harness.fmt(t['final_eval'][name])} | "
                   f"{harness.minutes(t['arm_seconds'][name])} |")
  if s.get("bases"):
    for name, (b, bl) in base_arm_names(sz).items():
      t = s["bases"]
      lines.append(f"| graded | G={g0}, {LABELS[bl]}, {BASE_LABELS[b]} base | "
                   f"{harness.fmt(t['cells'][name])} | {harness.fmt(t['gains'][name])} | "
                   f"{harness.fmt(t['final_eval'][name])} | "
                   f"{harness.minutes(s['arm_seconds'][name])} |")
  lines += ["", "## Differences at G=2 and the gap", "", "| reward | comparison | difference |",
            "| --- | --- | --- |"]
  for reward, prefix, t in tables:
    lines.append(f"| {reward} | G={g1} minus G={g0}, GRPO (the gap) | {harness.fmt(t['gap'])} |")
    for bl, c in t["vs"].items():
      lines.append(f"| {reward} | G={g0}: median minus {LABELS[bl]} | {harness.fmt(c)} |")
  lines.append("")
  for reward, prefix, t in tables:
    gc = t["gap_closed"]
    lines += [f"Fraction of the G={g0} to G={g1} gap the median closes, {reward} reward, "
              f"(median - mean) / (G{g1} - mean) at G={g0}: {gc['fraction']:+.2f} "
              f"[{gc['lo']:+.2f}, {gc['hi']:+.2f}] ({gc['method']}).", ""]
  if flips is not None:
    lines += [
        "## Advantage sign flips on the SFT policy", "",
        f"Reference: the mean reward of {sz.flip_reference} samples per prompt, "
        f"{sz.flip_prompts} prompts; groups cut from a separate pool of {sz.flip_pool} fresh "
        "completions per prompt. Over rollouts that reach the loss and whose reward differs "
        "from the reference: opposite sign(A) = -sign(r - b), zeroed A = 0, correct sign the "
        "rest.", "",
        "| reward | baseline | " + " | ".join(
            f"G={g} opposite / zeroed / correct" for g in (g0, g1)) + " |",
        "| --- | --- | --- | --- |"]
    for kind in ("binary", "graded"):
      for bl in BASELINES:
        cells = [f"{flips[kind][bl][g]['opposite']:.3f} / {flips[kind][bl][g]['zeroed']:.3f} / "
                 f"{flips[kind][bl][g]['correct']:.3f}" for g in (g0, g1)]
        lines.append(f"| {kind} | {LABELS[bl]} | " + " | ".join(cells) + " |")
  gate = [c for c in s["claims"] if c["claim"]["family"] == "testbed"]
  paper = [c for c in s["claims"] if c["claim"]["family"] == fam]
  lines += ["", "## Paper claims", "",
            "The testbed gate (one Holm family: GRPO's gains over the SFT start, one-sample t "
            "against it) must pass before the variant claims are read:", "",
            *harness.verdict_rows(gate), "",
            ("Gate passed: GRPO learns at both G." if s["base_learned"] else
             "**Gate failed**: GRPO did not demonstrably learn at both G, so the variant "
             "claims below compare arms of a testbed where the base method does not learn."),
            "", f"Variant claims (one Holm family), {sz.seeds} seeds per arm:", "",
            *harness.verdict_rows(paper), "",
            harness.protocol_note(paper), ""]
  every = list(s["claims"])
  sections = []
  if s.get("binary"):
    sections.append((s["binary"], "mc_grpo_01",
                     "### Secondary table: the same claims on the 0/1 reward",
                     "Pre-declared as secondary: its own gate and Holm families, judged the "
                     "same way.", "GRPO learns at both G on the 0/1 reward",
                     "on the 0/1 reward"))
  if s.get("bases"):
    sections.append((s["bases"], "mc_grpo_bases",
                     "### Over other bases: the median at G=2 over DAPO and Dr.GRPO (graded "
                     "reward)", "The paper's \"orthogonal to the base\" claim: each base's own "
                     "G=2 mean arm must gain over the SFT start (its own gate family), then "
                     "median vs mean over that base (one Holm family).",
                     "every base learns at G=2", "for a base"))
  for t, family, title, intro, passed, failed in sections:
    sub_gate = [c for c in t["claims"] if c["claim"]["family"] == "testbed"]
    sub = [c for c in t["claims"] if c["claim"]["family"] == family]
    every += t["claims"]
    lines += [title, "", intro, "", *harness.verdict_rows(sub_gate), "",
              (f"Gate passed: {passed}." if t["base_learned"] else
               f"**Gate failed** {failed}: the claims below are not judged."), "",
              *harness.verdict_rows(sub), "", harness.protocol_note(sub), ""]
  lines += [harness.rules_note(every), ""]
  r = s["rates"]
  if r is None:
    lines += ["The mechanism claim (opposite-sign rates) is measured on the CPU SFT policy "
              "only; full-size runs do not carry it.", ""]
    return "\n".join(lines)
  a, b = r["claim"]["arms"]
  lines += ["| claim (paper) | ours: a - b [interval] | z | p | rollouts | verdict |",
            "| --- | --- | --- | --- | --- | --- |",
            f"| {r['claim']['text']} | {a}: {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
            f"({flips['graded']['median'][g0]['opposite']:.3f} vs "
            f"{flips['graded']['mean'][g0]['opposite']:.3f}) | {r['z']:.2f} | {r['p']:.3g} | "
            f"{r['n'][0]} vs {r['n'][1]} | {r['verdict']} |", "",
            f"The mechanism claim compares opposite-sign rates pooled over rollouts ({a} minus "
            f"{b}, from the \"Advantage sign flips\" table, fresh groups): a one-sided "
            "two-proportion z-test (``harness.judge_proportions``), reproduced when p <= 0.05 "
            "and the 95% interval lies below 0, not Holm-adjusted. It treats rollouts as "
            "independent, which groups of the same prompts are not: a lenient test.", ""]
  return "\n".join(lines)


def plot(report: dict, out_dir: str) -> list[str]:
  results, flips, sz = report["data"]["arms"], _flips(report), _sizes(report["config"])
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.6))
  tables = [("", "-", "graded")] + ([(BINARY, ":", "0/1")] if sz.binary_secondary else [])
  for prefix, style, reward in tables:
    for i, (name, (g, bl)) in enumerate(arm_names(sz, prefix).items()):
      arm = results[name]
      steps = [e["step"] for e in arm["evals"]]
      vals = np.array([[x[METRIC] for x in e["per_seed"]] for e in arm["evals"]])
      ax.plot(steps, vals.mean(1), marker="o", linestyle=style, color=f"C{i}",
              label=f"{reward}: G={g}, {LABELS[bl]}")
  ax.set_xlabel("RL step")
  ax.set_ylabel("test pass@1 (mean over seeds)")
  ax.legend(fontsize=6)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "learning_curves.png"), dpi=120)
  plt.close(fig)

  if flips is None:
    return [os.path.join(out_dir, "learning_curves.png")]
  gs = [sz.small_g, sz.large_g]
  fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharey=True)
  for ax, kind in zip(axes, ("binary", "graded")):
    for bl in BASELINES:
      ax.plot(gs, [flips[kind][bl][g]["opposite"] for g in gs], "o-", label=f"{bl}: opposite")
      ax.plot(gs, [flips[kind][bl][g]["zeroed"] for g in gs], "s--", label=f"{bl}: zeroed")
    ax.set_title(f"{kind} reward")
    ax.set_xlabel("G")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("fraction of counted rollouts")
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "sign_flips.png"), dpi=120)
  plt.close(fig)
  return [os.path.join(out_dir, f) for f in ("learning_curves.png", "sign_flips.png")]


def replicate(config: dict, seeds: int, seed_offset: int) -> dict:
  """The primary (graded-reward) table's arms at fresh seeds; the exploratory 0/1 and other-base
  tables are left out."""
  return dict(config, seeds=seeds, seed_offset=seed_offset, binary_secondary=False, bases=[])


EXPERIMENT = harness.Experiment(name="mc_grpo", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot, collect=collect,
                                module="experiments.mc_grpo", full=from_full_runs,
                                replicate=replicate)


if __name__ == "__main__":
  sys.exit("run through: python scripts/reproduce.py mc_grpo")
