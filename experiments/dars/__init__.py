"""DARS / DARS-B at CPU scale, on the calibrated GRPO testbed: depth, breadth and their 2x2,
against a compute-matched naive N, with a stage 2 that never truncates.

Paper: "Depth-Breadth Synergy in RLVR" (DARS, DARS-B; official code yangzhch6/DARS). Claims
checked: (1) naively enlarging the rollout size N gives no pass@K gain; (2) DARS improves
pass@K, (3) also against the naive N of the same sampled rollouts; (4) breadth (more prompts
per step, full-batch updates over epochs) improves pass@1; (5, 6) DARS-B improves pass@1 and
pass@K; (7) depth adds pass@K on top of breadth (the "orthogonal dimensions" claim); plus the
cumulative-advantage bias (a sanity check by algebra) and how many all-wrong prompts the second
stage rescues.

Command:  python scripts/reproduce.py dars [--quick] [--seeds N] [--out DIR]
Hardware: 2 CPU cores. Setup (pre-declared in ``Sizes`` before the run): the calibrated testbed
of ``experiments/calibrate.py`` (setting ``b23-lr1e-4-kl0-p64``: 2-3 digit addition, whose
3-digit problems the SFT policy solves sometimes, the 0.4M-parameter character decoder
started from the pinned SFT policy ``experiments/testbeds/b23-sft``, 64 prompts per step, 0/1 reward, AdamW lr 1e-4, 100 steps). Every arm
uses the DARS objective (advantage r - mean over the merged group, token sum over a constant
length, dual clip, entropy bonus, no KL), so arms differ only in rollout allocation and breadth:

* ``grpo-n8``: N=8 per prompt, 2 mini-batches per step (the base);
* ``grpo-n16``: N=16, the naive N of the same sampled rollouts as ``dars-et``;
* ``dars-et``: N=8 in stage 1, equal-treatment stage 2 up to n_max=16 per prompt. The static
  stage-2 budget is P (n_max - N), the most the schedule can ask for, so it never truncates
  (the measured share of the budget used is in the table);
* ``grpo-b`` (breadth only): N=8, 4x the prompts per step, full-batch updates for 2 epochs, a
  quarter of the steps (the same rollouts in total as ``grpo-n8``);
* ``dars-b``: ``dars-et`` with ``grpo-b``'s breadth.

``grpo-n8``, ``dars-et``, ``grpo-b`` and ``dars-b`` are the 2x2 of breadth x depth. Breadth
comes as DARS-B's recipe has it: the breadth arms make 25 steps x 2 epochs x 1 full batch = 50
optimizer updates at the same learning rate, against 200 (100 steps x 2 mini-batches) for
``grpo-n8``, so "breadth" here is more prompts per update *and* 4x fewer updates; the breadth
claims are about that recipe, not about batch size alone.

Primary metrics (pre-declared): test pass@64 and pass@1 (unbiased estimator from 64 samples of
200 test problems at temperature 1), the mean of each seed's last 3 evaluations; the 3-digit
problems are reported beside all problems. Seeds: 8 per arm, from ``stats.seeds_needed`` at the
pilot SD 0.0075 (pass@64 over the last 3 evaluations, the ACE table's previous design) and the
minimum effect 0.02 (the margin of "no gain"), floor 8. GRPO must learn first: ``grpo-n8``'s
pass@1 gain over the SFT start is judged as a gate (its own family).

The paper's own setup at full size (accelerators, not run here): ``experiments/dars/full.py``;
``python scripts/reproduce.py dars --full --runs DIR`` judges its run directories (one per arm x
seed; the equal-treatment arms in the CPU arms' places, ``FULL_ARMS``) with this table's code.

Outputs in ``--out`` (default ``results/dars``): ``table.md``, ``results.json``, ``passk.png``,
``cumulative_advantage.png``; finished arms are cached under ``cache/``. The committed table ran
this design from the pinned start; its 110 min of units were shared with other jobs (about 55 min
alone).

The numbers this table last produced are in ``results/dars/table.md``, and copied into the results
section of ``experiments/dars/README.md`` by ``experiments/docsync.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments import harness, rl_seeds, rl_table
from rlpost import objectives as O
from rlpost.eval import stats
from rlpost.train import rl


@dataclasses.dataclass(frozen=True)
class Sizes(rl_table.Design):
  """The pre-declared design. Defaults fit ~60 minutes on 2 CPU cores."""

  num_prompts: int = 64
  n: int = 8
  n_max: int = 16
  breadth: int = 4
  hardest: int = 3  # difficulty bucket reported separately
  curve_prompts: int = 400  # cumulative-advantage analysis on the SFT policy
  min_effect: float = 0.02  # every claim's SESOI, also the bound of the "no gain" claim


def sizes(quick: bool) -> Sizes:
  if not quick:
    return Sizes()
  tiny = dict(rl_seeds.QUICK_BASE, sft_steps=400, sft_lr=3e-3,
              task_spec=dict(min_digits=1, max_digits=2, terms=2))
  return Sizes(seeds=2, steps=4, num_prompts=4, n=4, n_max=8, breadth=2, eval_every=2,
               window=2, eval_problems=8, eval_samples=8, hardest=2, curve_prompts=16,
               min_seeds=2, base=tiny)


def seeds_from_power(sz: Sizes) -> int:
  return max(sz.min_seeds, stats.seeds_needed(sz.pilot_sd, sz.min_effect))


def _ks(sz: Sizes) -> list[int]:
  return [k for k in (1, 4, 16, 64) if k <= sz.eval_samples]


def claims(sz: Sizes) -> list[harness.Claim]:
  """The gate (family "testbed": the base's pass@1 over the SFT start, filled in by
  ``summarize``) and the paper's claims about trained arms (family "dars")."""
  kmax, base = max(_ks(sz)), f"grpo-n{sz.n}"
  big, pk = f"grpo-n{sz.n_max}", f"pass@{kmax}"
  e = sz.min_effect  # every claim's smallest effect of interest (pass@k units)
  return [
      harness.Claim("grpo_learns", f"{base} gains pass@1 over the SFT start", "pass@1", (base,),
                    family="testbed"),
      # "No gain" is a non-superiority claim: one-sided against +min_effect.
      harness.Claim("naive_n_no_passk_gain", f"naively larger N gives no {pk} gain", pk,
                    (big, base), "not_greater", family="dars", sesoi=e),
      harness.Claim("dars_improves_passk", f"DARS improves {pk}", pk, ("dars-et", base),
                    family="dars", sesoi=e),
      harness.Claim("dars_beats_matched_n", f"DARS improves {pk} over the naive N of the same "
                    "sampled rollouts", pk, ("dars-et", big), family="dars", sesoi=e),
      harness.Claim("breadth_improves_pass1", "breadth improves pass@1", "pass@1",
                    ("grpo-b", base), family="dars", sesoi=e),
      harness.Claim("dars_b_improves_pass1", "DARS-B improves pass@1", "pass@1",
                    ("dars-b", base), family="dars", sesoi=e),
      harness.Claim("dars_b_improves_passk", f"DARS-B improves {pk}", pk, ("dars-b", base),
                    family="dars", sesoi=e),
      harness.Claim("depth_adds_to_breadth", f"depth adds {pk} on top of breadth", pk,
                    ("dars-b", "grpo-b"), family="dars", sesoi=e),
  ]


def arms(sz: Sizes) -> dict:
  """{arm name: RLConfig overrides}."""
  p, n, b = sz.num_prompts, sz.n, sz.breadth
  # The GRPO arms run DARS's objective with plain allocation, as the paper's baselines.
  common = dict(recipe="dars", allocation="plain", group_size=n, num_prompts=p,
                num_minibatches=2)
  # budget 0: P (n_max - N) stage-2 rows, the schedule's largest demand: never truncates
  depth = dict(allocation="dars", allocation_args=dict(schedule="et", n_max=sz.n_max, budget=0))
  breadth = dict(num_prompts=p * b, num_minibatches=1, num_iterations=2, steps=sz.steps // b,
                 eval_every=max(1, sz.eval_every // b))
  return {
      f"grpo-n{n}": dict(common),
      f"grpo-n{sz.n_max}": dict(common, group_size=sz.n_max),
      "dars-et": dict(common, **depth),
      "grpo-b": dict(common, **breadth),
      "dars-b": {**common, **depth, **breadth, "allocation": "dars_b"},
  }


def base_config(sz: Sizes) -> dict:
  from experiments import calibrate

  cfg = calibrate.testbed_config("b23-lr1e-4-kl0-p64")
  cfg.update(steps=sz.steps, eval_every=sz.eval_every, eval_problems=sz.eval_problems,
             eval_samples=sz.eval_samples, checkpoint_every=10 ** 9)
  cfg.pop("recipe_args", None)
  cfg.update(sz.base)
  return cfg


# ----------------------------------------------------------------- cumulative advantage curve
def cumulative_advantage_curve(trainer: rl.Trainer, sz: Sizes, *, seed: int = 0) -> dict:
  """Sum of |A_i| over a group against the group's accuracy, on the SFT policy.

  ``curve_prompts`` training prompts x N rollouts, scored with GRPO's advantage (mean and std)
  and Dr.GRPO / DARS's (mean only) from the library's recipes. Returns, per accuracy level
  j/N: the number of groups and the mean cumulative |A| under each advantage.
  """
  n, p = sz.n, sz.curve_prompts
  idx = jnp.repeat(jnp.arange(p, dtype=jnp.int32), n)
  ro = jax.jit(trainer.sample)(trainer.ref_params, idx, jax.random.key(seed))
  batch = O.RolloutBatch(group_id=jnp.repeat(jnp.arange(p, dtype=jnp.int32), n),
                         valid=jnp.ones((p * n,), bool), tokens=ro.tokens, token_mask=ro.mask,
                         rewards=ro.rewards)
  acc = np.asarray(ro.correct).reshape(p, n).mean(axis=1)
  out = {"accuracy": [j / n for j in range(n + 1)],
         "groups": [int(np.sum(np.isclose(acc, j / n))) for j in range(n + 1)]}
  for name in ("grpo", "dr_grpo"):
    kw = {} if name == "grpo" else {"max_length": trainer.max_new_tokens}
    adv, _ = O.compute_advantages(O.get_recipe(name, **kw).advantage, batch)
    cum = np.abs(np.asarray(adv.values)).reshape(p, n).sum(axis=1)
    out[name] = [float(cum[np.isclose(acc, j / n)].mean()) if np.any(np.isclose(acc, j / n))
                 else float("nan") for j in range(n + 1)]
  return out


# ---------------------------------------------------------------------------------- running
def get_config(quick: bool) -> dict:
  return dataclasses.asdict(sizes(quick))


def arm_configs(sz: Sizes) -> dict:
  """{arm name: full RLConfig dict}."""
  base = base_config(sz)
  return {name: dict(base, **kw) for name, kw in arms(sz).items()}


def units(config: dict) -> dict:
  sz = Sizes(**config)
  cfgs = arm_configs(sz)
  out = rl_seeds.arm_units(cfgs, list(range(sz.seed_offset, sz.seed_offset + sz.seeds)))
  grpo = cfgs[f"grpo-n{sz.n}"]
  out["curve"] = harness.Unit(
      {"curve": grpo, "n": sz.n, "prompts": sz.curve_prompts},
      lambda progress: cumulative_advantage_curve(rl.make_train(grpo, log=lambda s: None), sz))
  return out


def collect(config: dict, results: dict) -> dict:
  return {"arms": {k: v for k, v in results.items() if k != "curve"}, "curve": results["curve"]}


def _window(arm: dict, key: str, window: int) -> np.ndarray:
  """[S] the mean of each seed's last ``window`` evaluations (step 0 excluded)."""
  evals = arm["evals"][1:][-window:]
  return np.array([[e["per_seed"][i][key] for e in evals]
                   for i in range(len(arm["seeds"]))]).mean(axis=1)


def interaction(values: dict, level: float = 0.95) -> dict:
  """The breadth x depth interaction (dars-b - grpo-b) - (dars-et - grpo-n8) of four
  independent arms' per-seed values, with a Welch-Satterthwaite t interval."""
  return rl_table.contrast([values[a] for a in ("dars-b", "grpo-b", "dars-et", "base")],
                          (1.0, -1.0, -1.0, 1.0), level)


def summarize(report: dict) -> dict:
  sz = Sizes(**report["config"])
  results, curve = report["data"]["arms"], report["data"].get("curve")
  ks = _ks(sz)
  base_name = f"grpo-n{sz.n}"
  first = results[base_name]["evals"][0]["per_seed"]
  # the difficulty bucket where the task has one (digit counts; MATH records have none)
  keys = [f"pass@{k}" for k in ks] + [f"pass@{k}/d{sz.hardest}" for k in ks
                                      if f"pass@{k}/d{sz.hardest}" in first[0]]
  s = {"ks": ks, "keys": keys, "cells": {}, "vs_base": {}, "stage2": {},
       "seeds_from_power": seeds_from_power(sz),
       "arm_seconds": {n: a["seconds"] for n, a in results.items()},
       "updates": {n: _updates(a["config"]) for n, a in results.items()}}
  s["start"] = {k: float(np.mean([e[k] for e in first])) for k in keys}
  values = {k: {name: _window(arm, k, sz.window) for name, arm in results.items()}
            for k in keys}
  for name, arm in results.items():
    s["cells"][name] = {k: harness.cell(values[k][name]) for k in keys}
    if name != base_name:
      s["vs_base"][name] = {k: harness.diff_cell(values[k][name], values[k][base_name])
                            for k in keys}
    tr = arm["train"]
    if "dars_rescued" in tr:
      s["stage2"][name] = {key: float(np.mean(tr[key])) for key in (
          "dars_all_wrong_stage1", "dars_rescued", "dars_extra_rollouts", "dars_budget_used",
          "dars_truncated_fraction")
          if key in tr}
  s["interaction"] = {k: interaction({"dars-b": values[k]["dars-b"],
                                      "grpo-b": values[k]["grpo-b"],
                                      "dars-et": values[k]["dars-et"],
                                      "base": values[k][base_name]})
                      for k in ("pass@1", f"pass@{max(ks)}")}
  judged, s["base_learned"] = harness.judge_gated(claims(sz), values,
                                                  start=s["start"]["pass@1"], table="dars")
  s["claims"] = [v.to_json() for v in judged]
  s["verdicts"] = {v.claim.id: v.verdict for v in judged}
  s["sanity"] = None
  if curve is None:  # full-size runs: the curve is measured on the CPU SFT policy only
    return s
  acc = np.asarray(curve["accuracy"])
  dr = np.asarray(curve["dr_grpo"], np.float64)
  peak = float(acc[np.nanargmax(dr)]) if np.any(np.isfinite(dr)) else float("nan")
  s["curve_peak_accuracy"] = peak
  # A sanity check, not a claim: with A = r - mean and binary rewards the cumulative |A| of a
  # group of accuracy a is 2 N a (1 - a), which peaks at a = 0.5 by algebra.
  s["sanity"] = {"cumulative_advantage_peaks_at_half": (
      "inconclusive" if np.sum(np.isfinite(dr)) < 3  # too few accuracy levels observed
      else "holds" if abs(peak - 0.5) <= 1 / sz.n else "fails")}
  return s


def _updates(cfg: dict) -> int:
  """Optimizer updates of a run: steps x mini-batches x epochs."""
  return (int(cfg["steps"]) * int(cfg.get("num_minibatches", 1))
          * int(cfg.get("num_iterations", 1)))


def render(report: dict) -> str:
  from experiments import calibrate

  s, curve, sz = report["summary"], report["data"].get("curve"), Sizes(**report["config"])
  ks, keys = s["ks"], s["keys"]
  kmax = max(ks)
  base_name = f"grpo-n{sz.n}"
  setting = sz.setting or (f"{sz.steps} RL steps (breadth arms: {sz.steps // sz.breadth} steps "
                           f"of {sz.breadth}x the prompts), {calibrate.describe(base_config(sz))}")
  head = [k.replace(f"/d{sz.hardest}", f" ({sz.hardest}-digit)") for k in keys]
  paper = [c for c in s["claims"] if c["claim"]["family"] == "dars"]
  gate = [c for c in s["claims"] if c["claim"]["family"] == "testbed"]
  mdes = [c["mde"] for c in paper]
  lines = [
      "# DARS / DARS-B at full size" if report.get("full") else "# DARS / DARS-B at CPU scale",
      "", f"`{report['command']}`: {harness.seeds_note(sz, s['seeds_from_power'])}, "
      f"{setting}, DARS objective. "
      f"Primary metrics: test pass@{kmax} and pass@1 ({sz.eval_problems or 'all'} problems x "
      f"{sz.eval_samples} samples), the mean of each seed's last {sz.window} evaluations. "
      f"Minimum detectable effect of the claims: {min(mdes):.3f}-{max(mdes):.3f}. "
      f"{harness.wall_time(report)} Cells: mean [95% t interval over seeds]; differences: "
      "Welch intervals. Intervals exclude problem-sampling error (every arm is evaluated on "
      "the same fixed test problems with the same evaluation key). SFT start: "
      + ", ".join(f"{h} {s['start'][k]:.3f}" for h, k in zip(head, keys)) + ".", "",
      "## Test pass@k (last-3 mean)", "", "| arm | " + " | ".join(head) + " | minutes |",
      "| --- | " + " | ".join("---" for _ in keys) + " | --- |"]
  for n, c in s["cells"].items():
    lines.append(f"| {n} | " + " | ".join(harness.fmt(c[k]) for k in keys)
                 + f" | {harness.minutes(s['arm_seconds'][n])} |")
  lines += ["", f"## Minus {base_name}", "", "| arm | " + " | ".join(head) + " |",
            "| --- | " + " | ".join("---" for _ in keys) + " |"]
  for n, c in s["vs_base"].items():
    lines.append(f"| {n} | " + " | ".join(harness.fmt(c[k]) for k in keys) + " |")
  lines += ["", "## Breadth x depth", "",
            f"| metric | {base_name} | + depth (dars-et) | + breadth (grpo-b) | both (dars-b) | "
            "interaction (both - breadth) - (depth - base) |", "| --- | --- | --- | --- | --- | --- |"]
  for k, inter in s["interaction"].items():
    cells = [harness.fmt(s["cells"][a][k]) for a in (base_name, "dars-et", "grpo-b", "dars-b")]
    lines.append(f"| {k} | " + " | ".join(cells) + f" | {harness.fmt(inter)} |")
  lines += ["", "Interaction: Welch-Satterthwaite t interval over the four independent arms; "
            "0 is what orthogonal (additive) dimensions give.", "",
            "## Stage 2 (mean per step)", "",
            "| arm | stage-1 all-wrong prompts | rescued (>= 1 correct in stage 2) | stage-2 rows "
            "used | share of the budget used | share of the demand truncated |",
            "| --- | --- | --- | --- | --- | --- |"]
  nan = float("nan")
  for n, r in s["stage2"].items():
    lines.append(f"| {n} | {r['dars_all_wrong_stage1']:.2f} | {r['dars_rescued']:.2f} | "
                 f"{r['dars_extra_rollouts']:.1f} | {r.get('dars_budget_used', nan):.3f} | "
                 f"{r.get('dars_truncated_fraction', nan):.3f} |")
  stored = [rl.RLConfig.upgrade(dict(r["config"])) for r in report["data"]["arms"].values()]
  dars_args = [c["allocation_args"] for c in stored if c.get("allocation") in ("dars", "dars_b")]
  budgets = {a.get("budget", 0) for a in dars_args}
  chunks = {a.get("chunk", 0) for a in dars_args}
  lines += ["", ("Stage 2 is sampled in calls of " + "/".join(map(str, sorted(chunks)))
                 + " rows, as many as the step's demand needs, up to P (n_max - N) rows, the "
                 "schedule's largest demand, so no prompt's stage-2 rollouts are truncated; "
                 "the budget is that largest demand." if 0 not in chunks else
                 "The static budget is P (n_max - N) rows, the schedule's largest demand, so no "
                 "prompt's stage-2 rollouts are ever truncated; the rows it does not need are "
                 "sampled and left out of the update." if budgets <= {0} else
                 "The static stage-2 budget of these runs is below the schedule's largest "
                 f"demand (budget {sorted(budgets)}): a share used of 1.000 means demand "
                 "was truncated."), ""]
  if curve is not None:
    lines += [
        f"## Cumulative |advantage| per group vs group accuracy (SFT policy, N={sz.n})", "",
        "| accuracy | " + " | ".join(f"{a:.3g}" for a in curve["accuracy"]) + " |",
        "| --- | " + " | ".join("---" for _ in curve["accuracy"]) + " |",
        "| groups | " + " | ".join(str(g) for g in curve["groups"]) + " |",
        "| sum abs(A), mean only | " + " | ".join(f"{v:.2f}" for v in curve["dr_grpo"]) + " |",
        "| sum abs(A), mean and std | " + " | ".join(f"{v:.2f}" for v in curve["grpo"]) + " |",
        ""]
  ups = s.get("updates") or {}
  ub, ud = ups.get("grpo-b"), ups.get(base_name)
  lines += ["## Paper claims", "",
            f"The gate ({base_name}'s pass@1 over the SFT start, one-sample t against it) must "
            "pass before the DARS claims are read:", "", *harness.verdict_rows(gate), "",
            ("Gate passed: the base learns." if s["base_learned"] else
             "**Gate failed**: the base did not demonstrably learn, so the claims below compare "
             "arms of a testbed where the base method does not learn."), "",
            f"{sz.seeds} seeds per arm; one Holm family of {len(paper)} claims. The breadth "
            f"arms make {ub if ub is not None else sz.steps // sz.breadth * 2} optimizer "
            f"updates against {ud if ud is not None else sz.steps * 2} for {base_name} "
            "(DARS-B's recipe: full-batch updates over 2 epochs), so the breadth claims are "
            "about that recipe, not batch size alone.", "",
            *harness.verdict_rows(paper), "", harness.protocol_note(paper), "",
            harness.rules_note(s["claims"]), ""]
  if s.get("sanity"):
    lines += ["Sanity check (holds by algebra, not a reproduction): the mean-only cumulative "
              f"advantage peaks at accuracy 0.5: peak at {s['curve_peak_accuracy']:.3g}, "
              f"{s['sanity']['cumulative_advantage_peaks_at_half']}.", ""]
  else:
    lines += ["The cumulative-advantage sanity check is measured on the CPU SFT policy only; "
              "full-size runs do not carry it.", ""]
  return "\n".join(lines)


def plot(report: dict, out_dir: str) -> list[str]:
  s, curve, sz = report["summary"], report["data"].get("curve"), Sizes(**report["config"])
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ks = s["ks"]
  panels = [("", "all problems")]
  if f"pass@1/d{sz.hardest}" in s["keys"]:
    panels.append((f"/d{sz.hardest}", f"{sz.hardest}-digit problems"))
  fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4), squeeze=False)
  axes = axes[0]
  for ax, (suffix, title) in zip(axes, panels):
    for n, c in s["cells"].items():
      harness.errorbars(ax, ks, [c[f"pass@{k}{suffix}"] for k in ks], label=n, capsize=2)
    ax.plot(ks, [s["start"][f"pass@{k}{suffix}"] for k in ks], "k:", label="SFT start")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("test pass@k (last-3 mean)")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "passk.png"), dpi=120)
  plt.close(fig)
  if curve is None:
    return [os.path.join(out_dir, "passk.png")]
  fig, ax = plt.subplots(figsize=(4.8, 3.4))
  ax.plot(curve["accuracy"], curve["dr_grpo"], "o-", label="A = r - mean")
  ax.plot(curve["accuracy"], curve["grpo"], "s--", label="A = (r - mean) / std")
  ax.set_xlabel("group accuracy")
  ax.set_ylabel("cumulative |advantage| of the group")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "cumulative_advantage.png"), dpi=120)
  plt.close(fig)
  return [os.path.join(out_dir, f) for f in ("passk.png", "cumulative_advantage.png")]


# The full-size arms of ``experiments/dars/full.py`` that make this table, by the CPU arm they
# stand for (equal-treatment schedule; the hardness-weighted arms are not in the table).
FULL_ARMS = {"grpo-n8": "grpo-n8", "grpo-n16": "grpo-n16", "dars-et": "dars-et",
             "grpo-breadth": "grpo-b", "dars-b-et": "dars-b"}


def from_full_runs(runs_dir: str, prefix: str) -> tuple[dict, dict]:
  """Full-size runs of ``experiments/dars/full.py`` as this table's config and data: its
  equal-treatment arms in the CPU arms' places (``FULL_ARMS``); the cumulative-advantage curve
  and the digit bucket are CPU-only."""
  full_size = importlib.import_module("experiments.dars.full")
  from experiments.full_size import power_fields

  if prefix:
    raise harness.RunsError(f"dars --full: the table has one set of arms, no --prefix (got "
                            f"{prefix!r})")
  runs = harness.collect_runs(runs_dir, full_size.FULL, select=set(FULL_ARMS))
  missing = [n for n in FULL_ARMS if n not in runs]
  if missing:
    raise harness.RunsError(f"dars --full: no runs under {runs_dir} for arm(s) "
                            f"{', '.join(missing)}")
  # n_max names the naive-N arm (grpo-n16); dars-et's own n_max, 32, caps one prompt's
  # merged group
  base, wide = runs["grpo-n8"]["config"], runs["dars-b-et"]["config"]
  seeds = {n: len(runs[n]["seeds"]) for n in FULL_ARMS}
  sz = Sizes(seeds=min(seeds.values()), steps=base["steps"], num_prompts=base["num_prompts"],
             n=base["group_size"], n_max=runs["grpo-n16"]["config"]["group_size"],
             breadth=max(1, wide["num_prompts"] // base["num_prompts"]),
             eval_every=base["eval_every"], eval_problems=base["eval_problems"],
             eval_samples=base["eval_samples"], **power_fields(),
             setting=f"full size (experiments/dars/full.py: {base['task']}, {base['steps']} "
                     f"steps of {base['num_prompts']} prompts, breadth arms {wide['steps']} "
                     f"steps of {wide['num_prompts']}; lr {base['lr']:g} / {wide['lr']:g}"
                     + ("" if len(set(seeds.values())) == 1 else
                        f"; seeds per arm {seeds}, the header gives the fewest") + ")")
  return dataclasses.asdict(sz), {"arms": {FULL_ARMS[n]: runs[n] for n in FULL_ARMS}}


def replicate(config: dict, seeds: int, seed_offset: int) -> dict:
  """Every arm of the committed design (each enters a claim) at fresh seeds."""
  return dict(config, seeds=seeds, seed_offset=seed_offset)


EXPERIMENT = harness.Experiment(name="dars", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot, collect=collect,
                                module="experiments.dars", full=from_full_runs,
                                replicate=replicate)
