"""T5: weight averaging applied to RL (GRPO) checkpoints: pass@1 level and step-to-step volatility.

Command:  python scripts/reproduce.py averaging_rl [--quick] [--seeds N] [--out DIR] [--rejudge]
Hardware: CPU (2 cores). Each seed (one ``harness.Unit``, cached by its config) trains GRPO at
G = 8 on the calibrated testbed (``experiments/calibrate.py``: 2-3 digit addition from its cached
SFT policy, 64 prompts per step, lr 1e-4, no KL, where plain GRPO demonstrably learns) for 100
steps with ``rlpost.train.loop.run`` (in a temporary run directory), evaluating every 10 steps
the raw policy and, beside it, LAWA (k = 5 snapshots every 10 steps) and an EMA (decay 0.95 per
step) carried in the run loop (``RLConfig.averaging``). Each evaluation: 200 test problems x 8
samples, the same problems and evaluation key for every seed and policy. Seeds: 9 from power
(pilot SD 0.007, the previous 3-seed table's; minimum effect 0.01).

Metrics per seed and policy: pass@1 at the last step, mean pass@1 over the second half of the
evaluations, and volatility = the standard deviation of the change in pass@1 between successive
evaluations. Gate: the raw run's 2nd-half mean pass@1 above its step-0 (SFT) pass@1, paired by
seed; the averaging claims count only if it is reproduced. Pre-declared claims (one Holm family):
each average vs the raw policy of the same run (``paired=True``) on the second-half mean pass@1
(higher) and on the volatility (lower).

Outputs in ``--out`` (default ``results/averaging_rl``): ``table.md``, ``results.json`` (every
per-seed evaluation point of every policy, so ``--rejudge`` and the plot need nothing else),
``pass1_curves.png``.

The numbers this table last produced are in ``results/averaging_rl/table.md``, and copied into the
results section of ``experiments/averaging/README.md`` by ``experiments/docsync.py``.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from experiments import harness
from experiments.averaging import report as R

AVERAGING = "lawa:k=5,every=10,as=lawa;ema:decay=0.95,as=ema"
POLICIES = ("raw", "lawa", "ema")
METRICS = {"final": "final pass@1", "second_half_mean": "2nd-half mean pass@1",
           "volatility": "volatility (sd of eval-to-eval change)"}
NAME = "averaging_rl"
FAMILY = "averaging RL checkpoints"
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


# Seeds from power: the committed 3-seed table's largest pooled seed SD of its claims (0.007) at
# the minimum effect 0.01 pass@1, floor 8.
PILOT_SD, MIN_EFFECT, MIN_SEEDS = 0.007, 0.01, 8


def seeds_from_power() -> int:
  from rlpost.eval import stats

  return max(MIN_SEEDS, stats.seeds_needed(PILOT_SD, MIN_EFFECT))


def rl_config(quick: bool) -> dict:
  """The calibrated GRPO testbed (``experiments/calibrate.py``: 2-3 digit addition from its SFT
  start, 64 prompts per step, lr 1e-4, no KL, 100 steps) at G = 8, evaluated every 10 steps."""
  from experiments import calibrate

  cfg = dict(calibrate.testbed_config(), group_size=8, eval_every=10, eval_problems=200,
             eval_samples=8, checkpoint_every=50, averaging=AVERAGING)
  if quick:
    cfg.update(num_train=200, num_test=40, init_params="", sft_steps=10, sft_batch_size=32, num_prompts=4,
               group_size=4, steps=6, eval_every=2, checkpoint_every=2, eval_problems=8,
               eval_samples=4, eval_batch=32, task_spec=dict(min_digits=1, max_digits=2),
               model=dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                          intermediate_size=64))
  return cfg


def get_config(quick: bool) -> dict:
  return {"seeds": 2 if quick else seeds_from_power(), "rl": rl_config(quick),
          "pilot_sd": PILOT_SD, "min_effect": MIN_EFFECT, "min_seeds": MIN_SEEDS}


def curves(evals: list[dict]) -> dict:
  """{policy: [steps, pass@1]} from a run's evaluations (step 0 has no average yet)."""
  out = {}
  for pol in POLICIES:
    key = "pass@1" if pol == "raw" else f"avg/{pol}/pass@1"
    pts = [(e["step"], e[key]) for e in evals if key in e and e["step"] > 0]
    out[pol] = [[p[0] for p in pts], [float(p[1]) for p in pts]]
  return out


def run_seed(cfg: dict, progress) -> dict:
  from rlpost.train import loop, rl

  trainer = rl.make_train(cfg, log=lambda s: None)
  with tempfile.TemporaryDirectory(prefix="averaging_rl_") as run_dir:
    res = loop.run(trainer, run_dir, progress=False)
  progress(cfg["steps"])
  start = next(e["pass@1"] for e in res["evals"] if e["step"] == 0)
  return {"seed": cfg["seed"], "curves": curves(res["evals"]), "start": float(start)}


def units(config: dict) -> dict:
  out = {}
  first = config.get("seed_offset", 0)
  for seed in range(first, first + config["seeds"]):
    cfg = dict(config["rl"], seed=seed)
    out[f"s{seed}"] = harness.Unit(cfg, lambda progress, cfg=cfg: run_seed(cfg, progress),
                                   cfg["steps"])
  return out


def collect(config: dict, results: dict) -> dict:
  return {"per_seed": [{"seed": r["seed"], "curves": r["curves"], "start": r["start"]}
                       for r in results.values()]}


def starts(report: dict) -> dict:
  """{seed: (its run's config, its step-0 evaluation)} for the step-0 guard: every seed starts
  from the one SFT start."""
  return {f"s{r['seed']}": (dict(report["config"]["rl"], seed=r["seed"]), {"pass@1": r["start"]})
          for r in report["data"]["per_seed"]}


def seed_metrics(curve) -> dict:
  """{metric: value} of one seed's pass@1 curve of one policy."""
  vals = np.asarray(curve[1], np.float64)
  return {"final": float(vals[-1]), "second_half_mean": float(vals[len(vals) // 2:].mean()),
          "volatility": float(np.std(np.diff(vals))) if len(vals) > 2 else float("nan")}


def claims() -> list[harness.Claim]:
  out = []
  for pol in ("lawa", "ema"):
    out += [harness.Claim(f"{pol}_raises_pass1", f"averaging RL checkpoints ({pol}) raises the "
                          "pass@1 level (2nd-half mean)", "second_half_mean", (pol, "raw"),
                          "greater", family=FAMILY, paired=True, sesoi=MIN_EFFECT),
            harness.Claim(f"{pol}_damps_volatility", f"averaging RL checkpoints ({pol}) damps "
                          "step-to-step volatility", "volatility", (pol, "raw"), "less",
                          family=FAMILY, paired=True)]
  return out


GATE = harness.Claim("raw_learns", "the base run learns: raw 2nd-half mean pass@1 above the SFT "
                     "start", "second_half_mean", ("raw", "sft"), "greater", family="gate",
                     paired=True)


def summarize(report: dict) -> dict:
  """Cells and verdicts. The averaging claims count only when the gate (the raw run learns) is
  reproduced; otherwise they are reported as inconclusive."""
  per_seed = sorted(report["data"]["per_seed"], key=lambda s: s["seed"])
  values = {m: {pol: [seed_metrics(s["curves"][pol])[m] for s in per_seed] for pol in POLICIES}
            for m in METRICS}
  cells = {pol: {m: harness.cell(values[m][pol]) for m in METRICS} for pol in POLICIES}
  gate = []
  if len(per_seed) >= 2:
    sft = [s["start"] for s in per_seed]
    gate = harness.judge_family([GATE], {"second_half_mean": dict(values["second_half_mean"],
                                                                  sft=sft)}, table=NAME)
    cells["sft"] = {"second_half_mean": harness.cell(sft)}
  judged = harness.judge_family(claims(), values, table=NAME) if len(per_seed) >= 2 else []
  passed = bool(gate) and gate[0].verdict == "reproduced"
  verdicts = {v.claim.id: v.verdict if passed else "inconclusive" for v in judged}
  out = [dict(v.to_json(), verdict=verdicts[v.claim.id]) for v in judged]
  return {"values": values, "cells": cells, "claims": out, "verdicts": verdicts,
          "gate": [v.to_json() for v in gate], "gate_passed": passed}


def render(report: dict) -> str:
  s, cfg = report["summary"], report["config"]["rl"]
  n = len(report["data"]["per_seed"])
  judged = s["claims"]
  conf = report["config"]
  power = ""
  if conf.get("pilot_sd") is not None:
    from rlpost.eval import stats

    need = max(conf["min_seeds"], stats.seeds_needed(conf["pilot_sd"], conf["min_effect"]))
    power = (f" ({need} from power: pilot SD {conf['pilot_sd']}, minimum effect "
             f"{conf['min_effect']}, 80% power, alpha 0.05; floor {conf['min_seeds']})")
  from experiments import calibrate

  mdes = [v["mde"] for v in judged]
  lines = ["# T5: averaging GRPO checkpoints", "",
           f"`{report['command']}`: {n} seeds{power}; GRPO (G = {cfg['group_size']}) for "
           f"{cfg['steps']} steps on {calibrate.describe(cfg)}, evaluated every "
           f"{cfg['eval_every']} steps on {cfg['eval_problems']} test problems x "
           f"{cfg['eval_samples']} samples; averages `{cfg['averaging']}`; "
           f"{report['seconds'] / 60:.1f} min. {harness.provenance_note(report)}"
           + (f" Minimum detectable effect of the claims: {min(mdes):.3g}-{max(mdes):.3g}."
              if mdes else "") + " Cells: mean [95% t interval over seeds].", ""]
  if s.get("gate"):
    g = s["gate"][0]
    lines += ["## Gate: the base run learns", "",
              f"Raw GRPO's 2nd-half mean pass@1 against its SFT start "
              f"({harness.fmt(s['cells']['sft']['second_half_mean'])}), paired by seed: "
              f"{g['diff']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}], p {g['p']:.3g}: "
              f"**{g['verdict']}**." + ("" if s["gate_passed"] else
                                        " The base did not learn, so every averaging claim "
                                        "below is inconclusive."), ""]
  lines += ["## Paper claims", "",
           f"Pre-declared metrics: the mean pass@1 over the second half of the evaluations and the "
           f"volatility, per seed; averaged - raw of the same run, paired by seed; {n} seeds; one "
           "Holm family. Intervals exclude problem-sampling error: every seed and policy is "
           "evaluated on the same fixed test problems with the same evaluation key.", ""]
  lines += R.verdict_section(judged)
  lines += [harness.rules_note(judged) + " Here the tests are paired by seed (averaged - raw "
            "of one run); the exact sign-flip permutation p is the paired one (at "
            f"{n} seeds its smallest value is 1/{2 ** n}).", "",
           "## Per policy", "", "| policy | " + " | ".join(METRICS.values()) + " |",
           "| --- | " + " | ".join("---" for _ in METRICS) + " |"]
  for pol in POLICIES:
    lines.append(f"| {pol} | " + " | ".join(harness.fmt(s["cells"][pol][m]) for m in METRICS)
                 + " |")
  return "\n".join(lines) + "\n"


def plot(report: dict, out_dir: str) -> list[str]:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  per_seed = report["data"]["per_seed"]
  fig, ax = plt.subplots(figsize=(6, 3.5))
  colors = {"raw": "tab:gray", "lawa": "tab:blue", "ema": "tab:red"}
  for i, pol in enumerate(POLICIES):
    steps = np.asarray(per_seed[0]["curves"][pol][0], np.float64)
    vals = np.asarray([s["curves"][pol][1] for s in per_seed], np.float64)  # [S, E]
    shift = (i - 1) * 0.01 * (steps[-1] - steps[0] if len(steps) > 1 else 1.0)
    harness.errorbars(ax, steps + shift, [harness.cell(vals[:, j]) for j in range(vals.shape[1])],
                      color=colors[pol], label=pol, markersize=3)
  ax.set_xlabel("RL step")
  ax.set_ylabel("test pass@1 (mean, 95% t interval)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  path = os.path.join(out_dir, "pass1_curves.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return [path]


def replicate(config: dict, seeds: int, seed_offset: int) -> dict:
  """The committed design at fresh seeds (its one arm trains the raw run and both averages)."""
  return dict(config, seeds=seeds, seed_offset=seed_offset)


EXPERIMENT = harness.Experiment(name=NAME, get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot, collect=collect,
                                module="experiments.averaging.t5_rl", readme=README,
                                replicate=replicate, starts=starts)
