"""MC-GRPO at CPU scale, on the calibrated GRPO testbed: median vs mean baselines at G=2.

Paper: "MC-GRPO: Median-Centered Group Relative Policy Optimization" (official code
lotusroot-kim/MC-GRPO). Claims checked: at G=2 the median baseline over G+1 rollouts comes within
1% of G=8 and beats the mean over G and two same-compute controls; it gives fewer advantages of
the wrong sign. Command: python scripts/reproduce.py mc_grpo [--quick] [--seeds N] [--out DIR]
Setup (``Design``; in full in the README's "Setup"): the testbed ``b23-lr1e-4-kl0-p64`` of
``experiments/calibrate.py``, graded reward, no KL, GRPO at G=8 and four baselines at G=2 (also
on the 0/1 reward and over DAPO and Dr.GRPO, exploratory). Metric: test pass@1, the mean of each
seed's last 3 evaluations, 8 seeds per arm (power plan), gated on GRPO's gains over the SFT start.
Full size: ``experiments/mc_grpo/full.py``. Outputs in ``--out`` (default ``results/mc_grpo``):
``table.md``, ``results.json``, ``learning_curves.png``, ``sign_flips.png`` (the numbers last
produced: ``results/mc_grpo/table.md`` and the README's results section).
"""

from __future__ import annotations

import dataclasses

from experiments import claims as C
from experiments import report as R
from experiments import rl_seeds, rl_table
from experiments.mc_grpo.arms import overrides

BASELINES = ("mean", "median", "mean_drop", "mean_random")
LABELS = {"mean": "mean over G (GRPO)", "median": "median over G+1 (MC-GRPO)",
          "mean_drop": "mean over G+1, smallest |r| dropped (official ablation)",
          "mean_random": "mean over G+1, random rollout dropped (unbiased control)"}
BASE_LABELS = {"dapo": "DAPO", "dr_grpo": "Dr.GRPO"}
METRIC = "pass@1"  # per seed: the mean of the last ``window`` evaluations
BINARY = "01-"  # arm-name prefix of the secondary table's arms (0/1 reward)


@dataclasses.dataclass(frozen=True)
class Design(rl_table.Design):
  """The pre-declared design (~50 minutes on 2 CPU cores, ~14 of them the other bases' arms)."""

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
  primary_reward: str = "graded"  # "binary": a two-valued reward (full-size MATH), 0/1 claims


def primary_family(sz: Design) -> str:
  return "mc_grpo_01" if sz.primary_reward == "binary" else "mc_grpo"


def design(quick: bool) -> Design:
  return Design(seeds=2, steps=3, eval_every=1, window=2, eval_problems=8, eval_samples=4,
                large_g=4, min_seeds=2, flip_prompts=8, flip_reference=8, flip_pool=12,
                base=dict(rl_seeds.QUICK_SFT, num_prompts=4, eval_batch=32)) if quick else Design()


def base_config(sz: Design, *, graded: bool = True) -> dict:
  """The testbed's RLConfig dict: graded reward (the primary table) or 0/1 (the secondary)."""
  return rl_table.testbed_config(sz, graded_reward=graded)


def arm_names(sz: Design, prefix: str = "") -> dict:
  """{arm name: (G, baseline)}: G=8's mean, then every baseline at G=2 (``BINARY``: 0/1 arms)."""
  return {f"{prefix}G{sz.large_g}-mean": (sz.large_g, "mean"),
          **{f"{prefix}G{sz.small_g}-{bl}": (sz.small_g, bl) for bl in BASELINES}}


def base_arm_names(sz: Design) -> dict:
  """{arm name: (base, baseline)}: the mean and median at G=small_g over each of ``sz.bases``."""
  return {f"{b}-G{sz.small_g}-{bl}": (b, bl) for b in sz.bases for bl in ("mean", "median")}


def arms(sz: Design) -> dict:
  """{arm name: RLConfig overrides over the graded testbed}: primary, 0/1 and other-base arms."""
  kw = dict(kl_coef=0.0, rescale=True)
  binary = arm_names(sz, BINARY) if sz.binary_secondary else {}  # the same recipes, 0/1 reward
  return {**{n: overrides(g, bl, **kw) for n, (g, bl) in arm_names(sz).items()},
          **{n: dict(overrides(g, bl, **kw), graded_reward=False) for n, (g, bl) in binary.items()},
          **{n: overrides(sz.small_g, bl, recipe=b, **kw)
             for n, (b, bl) in base_arm_names(sz).items()}}


def claims(sz: Design, prefix: str = "") -> list[C.Claim]:
  """The gate (family "testbed": GRPO's gains over the SFT start) and the paper's claims (family
  "mc_grpo"); on the 0/1 reward (``prefix`` ``BINARY``, or ``primary_reward`` "binary") the same
  claims with ids ending in "_01", family "mc_grpo_01"."""
  g0, g1 = sz.small_g, sz.large_g
  tag, fam = ("_01", "mc_grpo_01") if prefix or sz.primary_reward == "binary" else ("", "mc_grpo")
  a = lambda name: prefix + name  # noqa: E731
  beats = [("mean_small_g", "the mean baseline", "mean"),
           ("random_drop_small_g", "the unbiased same-compute control", "mean_random"),
           ("min_abs_drop_small_g", "the official same-compute ablation", "mean_drop")]
  return [
      *(C.Claim(f"grpo_learns_{which}_g{tag}", f"GRPO at G={g} gains over the SFT start", "gain",
                (a(f"G{g}-mean"),), family="testbed")
        for which, g in (("large", g1), ("small", g0))),
      C.Claim("gap_within_1pct" + tag, f"the median at G={g0} comes within 1% of G={g1}", METRIC,
              (a(f"G{g1}-mean"), a(f"G{g0}-median")), "equivalent", 0.01, fam),  # the paper's 1%
      *(C.Claim(f"median_beats_{cid}{tag}", f"median beats {what} at G={g0}", METRIC,
                (a(f"G{g0}-median"), a(f"G{g0}-{bl}")), family=fam, sesoi=sz.min_effect)
        for cid, what, bl in beats)]


def base_claims(sz: Design) -> list[C.Claim]:
  """The paper's "orthogonal to the base" claim, one per base (family "mc_grpo_bases"), gated
  on each base's mean arm gaining over the SFT start (family "testbed")."""
  g0 = sz.small_g
  return [*(C.Claim(f"{b}_learns_small_g", f"{BASE_LABELS[b]} at G={g0} gains over the SFT "
                    "start", "gain", (f"{b}-G{g0}-mean",), family="testbed") for b in sz.bases),
          *(C.Claim(f"median_beats_mean_over_{b}", f"over {BASE_LABELS[b]}, the median beats the "
                    f"mean baseline at G={g0}", METRIC, (f"{b}-G{g0}-median", f"{b}-G{g0}-mean"),
                    family="mc_grpo_bases", sesoi=sz.min_effect) for b in sz.bases)]


def subtables(sz: Design) -> list[rl_table.Subtable]:
  """The gated sub-tables: the primary table, the 0/1 secondary and the other bases (their
  summaries under "binary" and "bases", None where the design does not run them)."""
  rows = lambda prefix="": {  # noqa: E731
      n: f"G={g}, {LABELS[bl]}" for n, (g, bl) in arm_names(sz, prefix).items()}
  return [rl_table.Subtable(
      "", "0/1" if sz.primary_reward == "binary" else "graded", rows(), primary_family(sz),
      "## Paper claims", rl_table.gate_intro(
          "one Holm family: GRPO's gains over the SFT start", "variant", "testbed gate"),
      rl_table.gate_outcome("GRPO", "variant", " at both G"),
      f"Variant claims (one Holm family), {sz.seeds} seeds per arm:"), rl_table.Subtable(
      "binary", "0/1", rows(BINARY), "mc_grpo_01",
      "### Secondary table: the same claims on the 0/1 reward",
      "Pre-declared as secondary: its own gate and Holm families, judged the same way.",
      rl_table.sub_outcome("GRPO learns at both G on the 0/1 reward", "on the 0/1 reward")),
      rl_table.Subtable(
          "bases", "graded", {n: f"G={sz.small_g}, {LABELS[bl]}, {BASE_LABELS[b]} base"
                              for n, (b, bl) in base_arm_names(sz).items()}, "mc_grpo_bases",
          "### Over other bases: the median at G=2 over DAPO and Dr.GRPO (graded reward)",
          "The paper's \"orthogonal to the base\" claim: each base's own G=2 mean arm must gain "
          "over the SFT start (its own gate family), then median vs mean over that base (one "
          "Holm family).", rl_table.sub_outcome("every base learns at G=2", "for a base"))]


# Each baseline's recipe and rollouts beyond G, as its arm has them, at the recipe's default
# arguments (the arms' rescale of non-zero advantages cannot change a sign).
FLIP_RECIPES = {bl: (o["recipe"], o["recipe_args"], o["group_size"] - 1)
                for bl in BASELINES for o in [overrides(1, bl)]}


def sign_flip_unit(sz: Design, cfgs: dict, config: dict) -> dict:
  """The sign-flip rates of the baselines on the SFT policy under both rewards, fresh groups."""
  return rl_table.sft_analysis(
      "sign_flips", cfgs[f"G{sz.small_g}-mean"], {"sizes": config, "design": "fresh groups"},
      lambda tr: rl_seeds.fresh_group_sign_flips(
          tr, FLIP_RECIPES, (sz.small_g, sz.large_g), rl_seeds.arithmetic_rewards(tr),
          prompts=sz.flip_prompts, reference=sz.flip_reference, pool=sz.flip_pool))


def from_full_runs(runs_dir: str, prefix: str) -> tuple[dict, dict]:
  """Full-size runs of ``experiments/mc_grpo/full.py`` (one dataset: ``prefix`` "math-" or
  "gsm8k-") as this table's config and data; the sign-flip analysis is CPU-only."""
  from experiments.mc_grpo import full

  rl_table.check_prefix("mc_grpo", prefix, ("math-", "gsm8k-"))
  sz = Design(binary_secondary=False, bases=())
  g0, g1 = f"G{sz.small_g}-median", f"G{sz.large_g}-mean"
  # Every run matched its arm's config, graded_reward included, and a dataset's arms share it.
  return rl_table.from_full(
      "mc_grpo", runs_dir, full.FULL, {prefix + n: n for n in arm_names(sz)}, sz, g0,
      lambda c: dict(primary_reward="graded" if c[g0].get("graded_reward") else "binary"),
      lambda d, c: f"{c[g0]['task']}, {c[g0]['num_prompts']} prompts per step at G={d.small_g}, "
      f"{c[g1]['num_prompts']} prompts x {c[g1]['steps']} steps at G={d.large_g}, lr "
      f"{c[g0]['lr']:g}, {'graded' if d.primary_reward == 'graded' else '0/1'} reward (claim "
      f"family {primary_family(d)})", label=f"full size, {prefix[:-1]}")


def _judge_table(results: dict, sz: Design, prefix: str = "") -> dict:
  """The cells, differences, gap fraction and verdicts of the arms ``arm_names(sz, prefix)``."""
  prim, t = rl_table.gated(results, arm_names(sz, prefix), claims(sz, prefix), METRIC, sz.window,
                           "mc_grpo")
  g0, g1 = f"{prefix}G{sz.small_g}", f"{prefix}G{sz.large_g}"
  return {**t, "vs": {bl: R.diff_cell(prim[f"{g0}-median"], prim[f"{g0}-{bl}"])
                      for bl in BASELINES if bl != "median"},
          "gap": R.diff_cell(prim[f"{g1}-mean"], prim[f"{g0}-mean"]),
          "gap_closed": rl_table.gap_fraction(prim[f"{g0}-mean"], prim[f"{g0}-median"],
                                              prim[f"{g1}-mean"])}


def summarize(report: dict) -> dict:
  results, sz = report["data"]["arms"], Design.of(report["config"])
  s = _judge_table(results, sz)
  s["seeds_from_power"] = sz.from_power()
  s["binary"] = _judge_table(results, sz, BINARY) if sz.binary_secondary else None
  s["bases"] = (rl_table.gated(results, base_arm_names(sz), base_claims(sz), METRIC, sz.window,
                               "mc_grpo", s["start_pass@1"])[1] if sz.bases else None)
  return rl_table.sign_flip_verdict(rl_table.merge_subtables(s, ("binary", "bases")), C.Claim(
      "median_fewer_sign_flips", "the median gives fewer opposite-sign advantages (graded reward)",
      "opposite-sign rate, graded reward", (f"median G={sz.small_g}", f"mean G={sz.small_g}"),
      "less"), rl_table.sign_flips(report), "graded", sz.small_g, ("median", "mean"))


def render(report: dict) -> str:
  s, flips, sz = report["summary"], rl_table.sign_flips(report), Design.of(report["config"])
  g0, g1, subs = sz.small_g, sz.large_g, subtables(sz)
  tables = [(sub.label, sub.of(s)) for sub in subs if sub.key != "bases" and sub.of(s)]
  lines = [*rl_table.header(
      report, "MC-GRPO", sz, s, setting=f"{sz.steps} RL steps, " + rl_table.setting(
          sz, base_config(sz), ", no KL" + ("; the same arms on the 0/1 reward as a secondary "
                                            "table" if sz.binary_secondary else "")),
      metric="metric: test pass@1", claims=(primary_family(sz), "variant claims"),
      start=f"{s['start_pass@1']:.3f}", start_first=True), "## Primary metric", ""]
  if s.get("binary"):
    lines += ["The secondary table trains the same arms with the same recipes on the 0/1 reward "
              "(1 for an exact answer, else 0), where a baseline can zero an advantage but never "
              "flip its sign; its SFT start is the same policy "
              f"({s['binary']['start_pass@1']:.3f}).", ""]
  lines += [*rl_table.gated_table(subs, s, "reward", METRIC),
            "", "## Differences at G=2 and the gap", "",
            *rl_table.md_table(["reward", "comparison", "difference"], [
                row for reward, t in tables for row in
                [[reward, f"G={g1} minus G={g0}, GRPO (the gap)", R.fmt(t["gap"])]]
                + [[reward, f"G={g0}: median minus {LABELS[bl]}", R.fmt(c)]
                   for bl, c in t["vs"].items()]]), ""]
  for reward, t in tables:
    lines += [f"Fraction of the G={g0} to G={g1} gap the median closes, {reward} reward, "
              f"(median - mean) / (G{g1} - mean) at G={g0}: {R.fmt_fraction(t['gap_closed'])}.", ""]
  lines += rl_table.sign_flip_section(flips, LABELS, (g0, g1), sz.flip_prompts, sz.flip_reference,
                                      sz.flip_pool)
  return "\n".join(lines + ["", *rl_table.gated_sections(subs, s),
                            *rl_table.sign_flip_verdict_rows(s["rates"], flips, "graded", g0, (
                                "median", "mean"), "The mechanism claim")])


def plot(report: dict, out_dir: str) -> list[str]:
  results, sz = report["data"]["arms"], Design.of(report["config"])
  paths = [rl_table.curves_plot(results, {  # the primary and 0/1 tables' arms
      n: dict(marker="o", linestyle=style, color=f"C{i}", label=f"{sub.label}: {label}")
      for sub, style in zip(subtables(sz)[:2], "-:") for i, (n, label) in enumerate(
          sub.arms.items()) if n in results}, METRIC, "test pass@1 (mean over seeds)", out_dir,
      "learning_curves.png")]
  return paths + rl_table.sign_flip_plot(rl_table.sign_flips(report), [sz.small_g, sz.large_g],
                                         out_dir)


EXPERIMENT = rl_table.experiment(
    "mc_grpo", design, arms, base_config, analyses=sign_flip_unit,
    summarize=summarize, render=render, plot=plot, full=from_full_runs,
    # a replication: the primary table's arms at fresh seeds (not the exploratory 0/1 and bases)
    replicate=lambda c, n, o: dict(c, seeds=n, seed_offset=o, binary_secondary=False, bases=[]))
get_config, units = EXPERIMENT.get_config, EXPERIMENT.units
