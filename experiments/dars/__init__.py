"""DARS / DARS-B at CPU scale, on the calibrated GRPO testbed: depth, breadth and their 2x2,
against a compute-matched naive N, with a stage 2 that never truncates.

Paper: "Depth-Breadth Synergy in RLVR" (DARS, DARS-B; official code yangzhch6/DARS). Claims
checked: (1) naively enlarging the rollout size N gives no pass@K gain; (2) DARS improves
pass@K, (3) also against the naive N of the same sampled rollouts; (4) breadth improves pass@1;
(5, 6) DARS-B improves pass@1 and pass@K; (7) depth adds pass@K on top of breadth; plus the
cumulative-advantage bias (a sanity check by algebra) and the all-wrong prompts stage 2 rescues.

Command:  python scripts/reproduce.py dars [--quick] [--seeds N] [--out DIR]
Setup (pre-declared in ``Design``; the arms and what "breadth" means here in
``experiments/dars/README.md``, "Setup"): the testbed ``b23-lr1e-4-kl0-p64`` of
``experiments/calibrate.py``, every arm on the DARS objective: ``plain-n8``, ``plain-n16``,
``dars-et``, ``plain-b``, ``dars-b``. Metrics: test pass@64 and pass@1 (200 problems x 64
samples), the mean of each seed's last 3 evaluations; 8 seeds per arm (power plan);
``plain-n8``'s pass@1 gain over the SFT start gates the claims. Full size:
``experiments/dars/full.py`` (``--full --runs DIR``, its arms in the CPU arms' places).
Outputs in ``--out`` (default ``results/dars``): ``table.md``, ``results.json``, ``passk.png``,
``cumulative_advantage.png``; finished arms are cached under ``cache/``. The numbers the table
last produced: ``results/dars/table.md`` and the README's results section.
"""

from __future__ import annotations

import dataclasses

from experiments import claims as C
from experiments import report as R
from experiments import rl_seeds, rl_table
from rlpost.train import rl

KS = (1, 4, 16, 64)
# The stage-2 metrics (mean per step): {train metric: (column heading, format)}
STAGE2 = {"dars_all_wrong_stage1": ("stage-1 all-wrong prompts", ".2f"),
          "dars_rescued": ("rescued (>= 1 correct in stage 2)", ".2f"),
          "dars_extra_rollouts": ("stage-2 rows used", ".1f"),
          "dars_budget_used": ("share of the budget used", ".3f"),
          "dars_truncated_fraction": ("share of the demand truncated", ".3f")}


@dataclasses.dataclass(frozen=True)
class Design(rl_table.Design):
  """The pre-declared design. Defaults fit ~60 minutes on 2 CPU cores."""

  num_prompts: int = 64
  n: int = 8
  n_max: int = 16
  breadth: int = 4
  hardest: int = 3  # difficulty bucket reported separately
  curve_prompts: int = 400  # cumulative-advantage analysis on the SFT policy
  min_effect: float = 0.02  # every claim's SESOI, also the bound of the "no gain" claim


def design(quick: bool) -> Design:
  return Design(seeds=2, steps=4, num_prompts=4, n=4, n_max=8, breadth=2, eval_every=2,
                window=2, eval_problems=8, eval_samples=8, hardest=2, curve_prompts=16,
                min_seeds=2, base=dict(rl_seeds.QUICK_SFT)) if quick else Design()


def claims(sz: Design) -> list[C.Claim]:
  """The gate (family "testbed": the base's pass@1 over the SFT start, filled in by
  ``summarize``) and the paper's claims about trained arms (family "dars"), each with the
  smallest effect of interest ``min_effect`` (pass@k units)."""
  kmax, base = max(sz.ks(KS)), f"plain-n{sz.n}"
  big, pk = f"plain-n{sz.n_max}", f"pass@{kmax}"
  # (id, text, metric, arms, direction); "no gain" is a non-superiority claim: one-sided
  # against +min_effect
  paper = [
      ("naive_n_no_passk_gain", f"naively larger N gives no {pk} gain", pk, (big, base),
       "not_greater"),
      ("dars_improves_passk", f"DARS improves {pk}", pk, ("dars-et", base), "greater"),
      ("dars_beats_matched_n", f"DARS improves {pk} over the naive N of the same sampled "
       "rollouts", pk, ("dars-et", big), "greater"),
      ("breadth_improves_pass1", "breadth improves pass@1", "pass@1", ("plain-b", base), "greater"),
      ("dars_b_improves_pass1", "DARS-B improves pass@1", "pass@1", ("dars-b", base), "greater"),
      ("dars_b_improves_passk", f"DARS-B improves {pk}", pk, ("dars-b", base), "greater"),
      ("depth_adds_to_breadth", f"depth adds {pk} on top of breadth", pk, ("dars-b", "plain-b"),
       "greater")]
  return [C.Claim("grpo_learns", f"{base} gains pass@1 over the SFT start", "pass@1", (base,),
                  family="testbed"),
          *(C.Claim(*c, family="dars", sesoi=sz.min_effect) for c in paper)]


def arms(sz: Design) -> dict:
  """{arm name: RLConfig overrides}."""
  p, n, b = sz.num_prompts, sz.n, sz.breadth
  # The plain-* arms run DARS's objective with plain allocation, as the paper's GRPO baselines.
  common = dict(recipe="dars", allocation="plain", group_size=n, num_prompts=p,
                num_minibatches=2)
  # budget 0: P (n_max - N) stage-2 rows, the schedule's largest demand: never truncates
  depth = dict(allocation="dars", allocation_args=dict(schedule="et", n_max=sz.n_max, budget=0))
  breadth = dict(num_prompts=p * b, num_minibatches=1, num_iterations=2, steps=sz.steps // b,
                 eval_every=max(1, sz.eval_every // b))
  return {
      f"plain-n{n}": dict(common),
      f"plain-n{sz.n_max}": dict(common, group_size=sz.n_max),
      "dars-et": dict(common, **depth),
      "plain-b": dict(common, **breadth),
      "dars-b": {**common, **depth, **breadth, "allocation": "dars_b"},
  }


def base_config(sz: Design) -> dict:
  return rl_table.testbed_config(sz, drop=("recipe_args",))


def curve_unit(sz: Design, cfgs: dict, config: dict) -> dict:
  """The cumulative |advantage| per group against its accuracy on the SFT policy, under GRPO's
  advantage (mean and std) and Dr.GRPO / DARS's (mean only)."""
  return rl_table.sft_analysis(
      "curve", cfgs[f"plain-n{sz.n}"], {"n": sz.n, "prompts": sz.curve_prompts},
      lambda trainer: rl_seeds.advantage_mass(trainer, {
          "grpo": {}, "dr_grpo": {"max_length": trainer.max_new_tokens}}, sz.curve_prompts, sz.n))


def summarize(report: dict) -> dict:
  sz = Design.of(report["config"])
  results, curve = report["data"]["arms"], report["data"].get("curve")
  ks, base = sz.ks(KS), f"plain-n{sz.n}"
  first = results[base]["evals"][0]["per_seed"][0]
  # the difficulty bucket where the task has one (digit counts; MATH records have none)
  keys = [f"pass@{k}" for k in ks] + [f"pass@{k}/d{sz.hardest}" for k in ks
                                      if f"pass@{k}/d{sz.hardest}" in first]
  values = rl_table.window_values(results, keys, sz.window)
  cells, vs_base = rl_table.cells(values, keys, base, results)
  s = {"ks": ks, "keys": keys, "cells": cells, "vs_base": vs_base,
       "stage2": rl_table.step_means(results, STAGE2),  # the arms that have a stage 2
       "seeds_from_power": sz.from_power(),
       "arm_seconds": {n: a["seconds"] for n, a in results.items()},
       "updates": {n: rl_table.updates(a["config"]) for n, a in results.items()},
       "start": rl_table.start_of(results[base], keys),
       # breadth x depth: (dars-b - plain-b) - (dars-et - base)
       "interaction": {k: rl_table.interaction(values[k], "dars-b", "plain-b", "dars-et", base)
                       for k in ("pass@1", f"pass@{max(ks)}")}}
  s.update(rl_table.judged(claims(sz), values, s["start"]["pass@1"], "dars"))
  s["sanity"] = None
  if curve is None:  # full-size runs: the curve is measured on the CPU SFT policy only
    return s
  # A sanity check, not a claim: with A = r - mean and binary rewards the cumulative |A| of a
  # group of accuracy a is 2 N a (1 - a), which peaks at a = 0.5 by algebra.
  s["curve_peak_accuracy"], verdict = rl_table.mass_peak(curve, "dr_grpo", 0.5, 1 / sz.n)
  s["sanity"] = {"cumulative_advantage_peaks_at_half": verdict}
  return s


def render(report: dict) -> str:
  s, curve, sz = report["summary"], report["data"].get("curve"), Design.of(report["config"])
  ks, keys, base = s["ks"], s["keys"], f"plain-n{sz.n}"
  setting = sz.setting or (f"{sz.steps} RL steps (breadth arms: {sz.steps // sz.breadth} steps "
                           f"of {sz.breadth}x the prompts), "
                           + rl_table.setting(sz, base_config(sz)))
  head = [k.replace(f"/d{sz.hardest}", f" ({sz.hardest}-digit)") for k in keys]
  paper, nan = rl_table.family(s, "dars"), float("nan")
  lines = [
      *rl_table.header(report, "DARS / DARS-B", sz, s, setting=f"{setting}, DARS objective",
                       metric=f"metrics: test pass@{max(ks)} and pass@1", claims=("dars", "claims"),
                       start=", ".join(f"{h} {s['start'][k]:.3f}" for h, k in zip(head, keys))),
      *rl_table.arm_tables(s, keys, head, s["vs_base"], f"Minus {base}"),
      "## Breadth x depth", "",
      *rl_table.md_table(
          ["metric", base, "+ depth (dars-et)", "+ breadth (plain-b)", "both (dars-b)",
           "interaction (both - breadth) - (depth - base)"],
          [[k, *(R.fmt(s["cells"][a][k]) for a in (base, "dars-et", "plain-b", "dars-b")),
            R.fmt(inter)] for k, inter in s["interaction"].items()]),
      "", "Interaction: Welch-Satterthwaite t interval over the four independent arms; 0 is what "
      "orthogonal (additive) dimensions give.", "", "## Stage 2 (mean per step)", "",
      *rl_table.step_means_table(s["stage2"], STAGE2)]
  stored = [rl.RLConfig.upgrade(dict(r["config"])) for r in report["data"]["arms"].values()]
  args = [c["allocation_args"] for c in stored if c.get("allocation") in ("dars", "dars_b")]
  budgets, chunks = {a.get("budget", 0) for a in args}, {a.get("chunk", 0) for a in args}
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
    lines += rl_table.advantage_mass_section(
        curve, {"dr_grpo": "mean only", "grpo": "mean and std"}, sz.n)
  ub, ud = s["updates"].get("plain-b"), s["updates"].get(base)
  lines += [*rl_table.claims_section(
      s, "dars", "## Paper claims", rl_table.gate_intro(f"{base}'s pass@1 over the SFT start",
                                                        "DARS"),
      rl_table.gate_outcome("the base", ""),
      f"{sz.seeds} seeds per arm; one Holm family of {len(paper)} claims. The breadth arms make "
      f"{ub if ub is not None else sz.steps // sz.breadth * 2} optimizer updates against "
      f"{ud if ud is not None else sz.steps * 2} for {base} (DARS-B's recipe: full-batch updates "
      "over 2 epochs), so the breadth claims are about that recipe, not batch size alone."),
      R.rules_note(s["claims"]), "",
      "Sanity check (holds by algebra, not a reproduction): the mean-only cumulative advantage "
      f"peaks at accuracy 0.5: peak at {s.get('curve_peak_accuracy', nan):.3g}, "
      f"{s['sanity']['cumulative_advantage_peaks_at_half']}." if s.get("sanity") else
      rl_table.cpu_only("The cumulative-advantage sanity check"), ""]
  return "\n".join(lines)


def plot(report: dict, out_dir: str) -> list[str]:
  s, curve, sz = report["summary"], report["data"].get("curve"), Design.of(report["config"])
  panels = [("", "all problems")] + ([(f"/d{sz.hardest}", f"{sz.hardest}-digit problems")]
                                     if f"pass@1/d{sz.hardest}" in s["keys"] else [])
  paths = [rl_table.passk_figure(s, out_dir, (4.5 * len(panels), 3.4), panels)]
  if curve is None:
    return paths
  return paths + [rl_table.advantage_mass_plot(curve, {
      "dr_grpo": "A = r - mean", "grpo": "A = (r - mean) / std"}, out_dir)]


# The full-size arms of ``experiments/dars/full.py`` that make this table, by the CPU arm they
# stand for (equal-treatment schedule; the hardness-weighted arms are not in the table).
FULL_ARMS = {"plain-n8": "plain-n8", "plain-n16": "plain-n16", "dars-et": "dars-et",
             "plain-breadth": "plain-b", "dars-b-et": "dars-b"}


def from_full_runs(runs_dir: str, prefix: str) -> tuple[dict, dict]:
  """Full-size runs of ``experiments/dars/full.py`` as this table's config and data: its
  equal-treatment arms in the CPU arms' places (``FULL_ARMS``); the cumulative-advantage curve
  and the digit bucket are CPU-only."""
  from experiments.dars import full

  rl_table.check_prefix("dars", prefix)
  # n_max names the naive-N arm (plain-n16); dars-et's own n_max, 32, caps one prompt's
  # merged group
  return rl_table.from_full(
      "dars", runs_dir, full.FULL, FULL_ARMS, Design(), "plain-n8", lambda c: dict(
          num_prompts=c["plain-n8"]["num_prompts"], n=c["plain-n8"]["group_size"],
          n_max=c["plain-n16"]["group_size"],
          breadth=max(1, c["dars-b"]["num_prompts"] // c["plain-n8"]["num_prompts"])),
      lambda d, c: f"{c['plain-n8']['task']}, {c['plain-n8']['steps']} steps of "
      f"{c['plain-n8']['num_prompts']} prompts, breadth arms {c['dars-b']['steps']} steps of "
      f"{c['dars-b']['num_prompts']}; lr {c['plain-n8']['lr']:g} / {c['dars-b']['lr']:g}")


EXPERIMENT = rl_table.experiment(
    "dars", design, arms, base_config, analyses=curve_unit, summarize=summarize,
    render=render, plot=plot, full=from_full_runs,
    # a replication: every arm of the committed design (each enters a claim) at fresh seeds
    replicate=lambda c, n, o: dict(c, seeds=n, seed_offset=o))
get_config, units = EXPERIMENT.get_config, EXPERIMENT.units
