"""The shared layer of the RL tables (``mc_grpo``, ``ace``, ``dars``): what a table on the GRPO
testbed needs besides its own design and claims.

* the design's common fields (``Design``: seeds, steps, evaluation, the power plan's inputs) and
  the testbed's RLConfig dict they set (``testbed_config``);
* arms as data: {arm name: RLConfig overrides over the table's base config} (``arm_configs``),
  trained as vmapped seed blocks (``arm_units``, ``experiments/rl_seeds.py``), and analyses on
  the SFT start beside them (``sft_analysis``);
* the evaluation windows (``window_values``: the per-seed mean of the last ``window``
  evaluations, step 0 excluded), training metrics per step (``train_mean``, ``step_means``), the
  start the gate is judged against (``start_of``), the standard cells and differences
  (``cells``), the gated verdicts (``judged``) and the gated summary of a table judged on one
  metric (``gated``, its sub-tables' verdicts merged by ``merge_subtables``);
* the statistics a table reports beside its claims: ``gap_fraction`` (a BCa ratio of three arms),
  ``contrast`` (a signed sum of independent arms' means), ``interaction`` (of a 2x2) and
  ``mass_peak`` (where an advantage-mass curve peaks);
* the renderer of the standard sections: the title and first paragraph (``header``), markdown
  tables (``md_table``, ``step_means_table``), the paper-claims section with its gate
  (``claims_section``), gated sub-tables as data (``Subtable``: their arms' rows and claims
  sections), and the plots (``curve``, ``curves_plot``, ``passk_figure``, ``save``);
* the SFT-policy analyses of ``experiments/rl_seeds.py`` rendered: fresh-group sign flips
  (``sign_flip_section``, ``sign_flip_plot``, the two-proportion claim ``sign_flip_verdict``)
  and the advantage mass by group accuracy (``advantage_mass_section``, ``advantage_mass_plot``);
* the full-size runs of a table's arms as its config and data (``from_full``, ``check_prefix``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from typing import Mapping, Sequence

import numpy as np
import scipy.stats

from experiments import claims as claims_lib
from experiments import harness, report, rl_seeds, runs
from rlpost.eval import stats
from rlpost.train import rl

# The calibrated testbed every RL table runs on (``experiments/calibrate.py``).
TESTBED = "b23-lr1e-4-kl0-p64"
CELLS_NOTE = ("Cells: mean [95% t interval over seeds]; differences: Welch intervals. Intervals "
              "exclude problem-sampling error (every arm is evaluated on the same fixed test "
              "problems with the same evaluation key).")


@dataclasses.dataclass(frozen=True)
class Design:
  """The pre-declared fields every RL table's design has (a table subclasses it with its own)."""

  seeds: int = 8
  seed_offset: int = 0  # the first seed (a replication runs seeds the table did not use)
  steps: int = 100
  eval_every: int = 20
  window: int = 3
  eval_problems: int = 200
  eval_samples: int = 64
  pilot_sd: float = 0.0075
  min_effect: float = 0.015
  min_seeds: int = 8
  base: dict = dataclasses.field(default_factory=dict)
  setting: str = ""  # the testbed in words when it is not the CPU one (full-size runs)
  sd_source: str = ""  # where pilot_sd comes from when not the CPU pilot (full-size runs)

  @classmethod
  def of(cls, config: Mapping):
    """The design of a results.json ``config`` (JSON lists back to tuples)."""
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})

  def seed_list(self) -> list[int]:
    return list(range(self.seed_offset, self.seed_offset + self.seeds))

  def ks(self, grid: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> list[int]:
    """The k of pass@k reported: those of ``grid`` within the evaluation's samples."""
    return [k for k in grid if k <= self.eval_samples]

  def from_power(self) -> int:
    """Seeds per arm the power plan asks for (``harness.power_plan``)."""
    return harness.power_plan(dataclasses.asdict(self))


def testbed_config(d: Design, *, drop: Sequence[str] = (), **extra) -> dict:
  """The testbed's RLConfig dict at the design's steps and evaluation, with ``extra`` keys,
  without the keys ``drop``, and the design's ``base`` overrides last."""
  from experiments import calibrate

  cfg = calibrate.testbed_config(TESTBED)
  cfg.update(steps=d.steps, eval_every=d.eval_every, eval_problems=d.eval_problems,
             eval_samples=d.eval_samples, checkpoint_every=10 ** 9)
  cfg.update(extra)
  for k in drop:
    cfg.pop(k, None)
  cfg.update(d.base)
  return cfg


def experiment(name: str, design, arms, base_config, *, analyses=None,
               **kw) -> harness.Experiment:
  """The ``harness.Experiment`` of RL table ``name`` (module ``experiments.<name>``): its config
  is the fields of ``design(quick)`` (a ``Design``), its units each arm of ``arms(d)`` over
  ``base_config(d)`` as a vmapped seed block, then ``analyses(d, arm configs, config)`` (units
  beside the arms, ``sft_analysis``), ``d`` being the design a config holds; results.json keeps
  the arms under "arms" and each analysis under its unit id when there are analyses. ``kw``:
  the other ``Experiment`` fields."""
  cls = type(design(False))

  def units(config: dict) -> dict:
    d = cls.of(config)
    cfgs = arm_configs(base_config(d), arms(d))
    return dict(arm_units(d, cfgs), **(analyses(d, cfgs, config) if analyses else {}))

  def collect(config: dict, results: Mapping) -> dict:
    names = arms(cls.of(config))
    return {"arms": {k: v for k, v in results.items() if k in names},
            **{k: v for k, v in results.items() if k not in names}}

  if analyses:
    kw.setdefault("collect", collect)
  return harness.Experiment(name=name, get_config=lambda quick: dataclasses.asdict(design(quick)),
                            units=units, module=f"experiments.{name}", **kw)


def sft_analysis(key: str, cfg: Mapping, spec: Mapping, fn) -> dict:
  """{key: harness.Unit}: ``fn(trainer)`` on the SFT start of RLConfig dict ``cfg`` (an analysis
  beside the arms); its spec is ``cfg`` under ``key`` and ``spec``, and the file defining ``fn``
  and ``experiments/rl_seeds.py`` (the analyses' sampling) count in its code version."""
  return {key: harness.Unit(
      {key: cfg, **spec}, lambda progress: fn(rl.make_train(cfg, log=lambda s: None)),
      code=(inspect.getsourcefile(fn), inspect.getsourcefile(rl_seeds)))}


def setting(d: Design, cfg: Mapping, tail: str = "") -> str:
  """The testbed of RLConfig dict ``cfg`` in words and ``tail``, or the design's own
  ``setting`` (full-size runs)."""
  from experiments import calibrate

  return d.setting or calibrate.describe(cfg) + tail


def arm_configs(base: Mapping, arms: Mapping[str, Mapping]) -> dict:
  """{arm name: RLConfig dict}: each arm's overrides over ``base``."""
  return {name: dict(base, **overrides) for name, overrides in arms.items()}


def arm_units(d: Design, cfgs: Mapping[str, dict]) -> dict:
  """{arm name: harness.Unit}: each arm's seeds as one vmapped block."""
  return rl_seeds.arm_units(dict(cfgs), d.seed_list())


# ------------------------------------------------------------------------------------ values
def window_mean(arm: Mapping, key: str, window: int) -> np.ndarray:
  """[S] the mean of each seed's last ``window`` evaluations (step 0 excluded)."""
  evals = arm["evals"][1:][-window:]
  return np.array([[e["per_seed"][i][key] for e in evals]
                   for i in range(len(arm["seeds"]))]).mean(axis=1)


def window_values(results: Mapping, keys: Sequence[str], window: int) -> dict:
  """{key: {arm: [S] window means}}."""
  return {k: {n: window_mean(arm, k, window) for n, arm in results.items()} for k in keys}


def updates(cfg: Mapping) -> int:
  """Optimizer updates of a run of RLConfig dict ``cfg``: steps x mini-batches x epochs."""
  return (int(cfg["steps"]) * int(cfg.get("num_minibatches", 1))
          * int(cfg.get("num_iterations", 1)))


def train_mean(arm: Mapping, key: str) -> np.ndarray:
  """[S] the mean of a training metric over the second half of training, per seed."""
  v = np.asarray(arm["train"][key])  # [steps, S]
  return v[len(v) // 2:].mean(axis=0)


def step_means(results: Mapping, keys: Sequence[str]) -> dict:
  """{arm: {key: its mean over steps and seeds}} of the training metrics ``keys`` an arm logs,
  over the arms that log any of them."""
  return {n: {k: float(np.mean(a["train"][k])) for k in keys if k in a["train"]}
          for n, a in results.items() if any(k in a["train"] for k in keys)}


def start_of(arm: Mapping, keys: Sequence[str]) -> dict:
  """{key: the step-0 evaluation} (every seed shares it)."""
  first = arm["evals"][0]["per_seed"]
  return {k: float(np.mean([e[k] for e in first])) for k in keys}


def cells(values: Mapping, keys: Sequence[str], base: str, names) -> tuple[dict, dict]:
  """({arm: {key: cell}}, {arm: {key: arm minus ``base``}}) over ``names``."""
  cell = {n: {k: report.cell(values[k][n]) for k in keys} for n in names}
  diff = {n: {k: report.diff_cell(values[k][n], values[k][base]) for k in keys}
          for n in names if n != base}
  return cell, diff


def judged(claims: Sequence[claims_lib.Claim], values: Mapping, start: float,
           table: str) -> dict:
  """{"base_learned", "claims", "verdicts"}: ``claims_lib.judge_gated``'s verdicts as JSON."""
  verdicts, learned = claims_lib.judge_gated(claims, values, start=start, table=table)
  return {"base_learned": learned, "claims": [v.to_json() for v in verdicts],
          "verdicts": {v.claim.id: v.verdict for v in verdicts}}


def family(s: Mapping, name: str) -> list[dict]:
  """The judged claims of family ``name`` in a summary."""
  return [c for c in s["claims"] if c["claim"]["family"] == name]


def gated(results: Mapping, names, claims: Sequence[claims_lib.Claim], metric: str, window: int,
          table: str, start: float | None = None) -> tuple[dict, dict]:
  """(per-seed ``metric`` of the arms ``names``, their summary: each arm's cell, gain over the
  SFT start ``start``, final evaluation and seconds, and the gated verdicts of ``claims``, whose
  gate claims are on the metric "gain"); ``start`` None: the first arm's step-0 evaluation, first
  in the summary as "start_<metric>"."""
  prim = {n: window_mean(results[n], metric, window) for n in names}
  own = start is None
  start = start_of(results[next(iter(names))], [metric])[metric] if own else start
  return prim, {
      **({f"start_{metric}": start} if own else {}),
      "cells": {n: report.cell(v) for n, v in prim.items()},
      "gains": {n: report.cell(v - start) for n, v in prim.items()},
      "final_eval": {n: report.cell(rl_seeds.final_metric(results[n], metric)) for n in names},
      "arm_seconds": {n: results[n]["seconds"] for n in names},
      **judged(claims, {"gain": prim, metric: prim}, start, table)}


def mass_peak(curve: Mapping, recipe: str, at: float, tol: float) -> tuple[float, str]:
  """(the accuracy where recipe ``recipe``'s cumulative |advantage| of ``rl_seeds.advantage_mass``
  peaks, "holds" when it lies within ``tol`` of ``at``, else "fails"; "inconclusive" where fewer
  than 3 accuracy levels were observed)."""
  acc, mass = np.asarray(curve["accuracy"]), np.asarray(curve[recipe], np.float64)
  peak = float(acc[np.nanargmax(mass)]) if np.any(np.isfinite(mass)) else float("nan")
  return peak, ("inconclusive" if np.sum(np.isfinite(mass)) < 3
                else "holds" if abs(peak - at) <= tol else "fails")


def merge_subtables(s: dict, keys: Sequence[str]) -> dict:
  """``s`` with the verdicts and arm seconds of its sub-table summaries ``s[key]`` (those not
  None) added to its own."""
  for t in filter(None, (s[k] for k in keys)):
    s["verdicts"].update(t["verdicts"])
    s["arm_seconds"].update(t["arm_seconds"])
  return s


def gap_fraction(low, mid, high, *, level: float = 0.95, n_resamples: int = 9999,
                 seed: int = 0) -> dict:
  """(mean(mid) - mean(low)) / (mean(high) - mean(low)) of three independent arms' per-seed
  values, with a BCa bootstrap interval (each arm's seeds resampled on their own)."""
  low, mid, high = (np.asarray(x, np.float64) for x in (low, mid, high))

  def frac(a, b, c, axis=-1):
    return (np.mean(b, axis=axis) - np.mean(a, axis=axis)) / (
        np.mean(c, axis=axis) - np.mean(a, axis=axis))

  est = float(frac(low, mid, high))
  try:
    res = scipy.stats.bootstrap((low, mid, high), frac, vectorized=True, paired=False,
                                confidence_level=level, method="BCa", n_resamples=n_resamples,
                                rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
  except (ValueError, FloatingPointError):
    lo = hi = float("nan")
  return {"fraction": est, "lo": lo, "hi": hi, "method": f"BCa bootstrap, {n_resamples} "
          "resamples, arms resampled independently"}


def contrast(arms: Sequence, signs: Sequence[float], level: float = 0.95) -> dict:
  """sum(sign x mean) of independent arms' per-seed values with a Welch-Satterthwaite t
  interval: {"mean", "lo", "hi"}."""
  xs = [np.asarray(a, np.float64) for a in arms]
  est = float(sum(s * x.mean() for s, x in zip(signs, xs)))
  v = [x.var(ddof=1) / len(x) for x in xs]
  se = math.sqrt(sum(v))
  df = sum(v) ** 2 / sum(vi ** 2 / (len(x) - 1) for vi, x in zip(v, xs)) if se > 0 else 1.0
  lo, hi = stats.t_interval(est, se, df, level)
  return {"mean": est, "lo": float(lo), "hi": float(hi)}


def interaction(values: Mapping, both: str, second: str, first: str, base: str,
                level: float = 0.95) -> dict:
  """The interaction (both - second) - (first - base) of a 2x2 of four independent arms'
  per-seed values ``values[arm]`` (``contrast``): 0 where the two factors add."""
  return contrast([values[a] for a in (both, second, first, base)], (1.0, -1.0, -1.0, 1.0), level)


# --------------------------------------------------------------------------------- rendering
def header(report_: Mapping, name: str, d: Design, s: Mapping, *, setting: str, metric: str,
           claims: tuple[str, str], start: str, start_first: bool = False) -> list[str]:
  """The table's title (``name`` at CPU scale or full size) and first paragraph: the command,
  seeds and ``setting``, the primary ``metric``, the minimum detectable effect of the claims
  ``claims`` (their family in ``s``, their name in words), wall time and provenance, what the
  cells are and the SFT start (``start``, before the minimum detectable effect when
  ``start_first``)."""
  mde_of, mdes = claims[1], [c["mde"] for c in family(s, claims[0])]
  lead = [f"`{report_['command']}`: {report.seeds_note(d, s['seeds_from_power'])}, {setting}.",
          f"Primary {metric} ({d.eval_problems or 'all'} problems x {d.eval_samples} samples), "
          f"the mean of each seed's last {d.window} evaluations."]
  rest = [f"Minimum detectable effect of the {mde_of}: {min(mdes):.3f}-{max(mdes):.3f}.",
          report.wall_time(report_), CELLS_NOTE]
  start = f"SFT start: {start}."
  return [f"# {name} at {'full size' if report_.get('full') else 'CPU scale'}", "",
          " ".join(lead + ([start] + rest if start_first else rest + [start])), ""]


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  """A markdown table's lines."""
  return ["| " + " | ".join(r) + " |" for r in [head, ["---"] * len(head), *rows]]


def arm_tables(s: Mapping, keys: Sequence[str], head: Sequence[str], diffs: Mapping,
               minus: str, minus_head: Sequence[str] | None = None, label=lambda n: n) -> list:
  """The standard sections of a pass@k table: every arm's cells over ``keys`` (columns ``head``,
  rows named ``label(arm)``) with its minutes, then ``diffs`` (arm minus the base) under the
  heading ``minus``."""
  return ["## Test pass@k (last-3 mean)", "",
          *md_table(["arm", *head, "minutes"], [
              [label(n), *(report.fmt(c[k]) for k in keys), report.minutes(s["arm_seconds"][n])]
              for n, c in s["cells"].items()]),
          "", f"## {minus}", "",
          *md_table(["arm", *(minus_head or head)],
                    [[n, *(report.fmt(g[k]) for k in keys)] for n, g in diffs.items()]), ""]


def step_means_table(means: Mapping, cols: Mapping[str, tuple[str, str]]) -> list[str]:
  """A row per arm of ``step_means``'s ``means``: the columns {key: (heading, format)} of
  ``cols`` that some arm logs (nan where another does not)."""
  keys = [k for k in cols if any(k in m for m in means.values())]
  return md_table(["arm", *(cols[k][0] for k in keys)],
                  [[n, *(format(m.get(k, float("nan")), cols[k][1]) for k in keys)]
                   for n, m in means.items()])


def gate_intro(what: str, claims: str, gate: str = "gate") -> str:
  return (f"The {gate} ({what}, one-sample t against it) must pass before the {claims} claims "
          "are read:")


def gate_outcome(who: str, claims: str, where: str = "") -> tuple[str, str]:
  """(passed, failed): the sentences under a table's gate."""
  which = f"the {claims} claims" if claims else "the claims"
  return (f"Gate passed: {who} learns{where}.",
          f"**Gate failed**: {who} did not demonstrably learn{where}, so {which} below compare "
          "arms of a testbed where the base method does not learn.")


def claims_section(s: Mapping, name: str, heading: str, intro: str,
                   outcome: tuple[str, str], note: str | None = None) -> list[str]:
  """A gated family's section: ``heading``, ``intro``, the gate's rows, whether it passed, then
  ``note`` (if any), the rows of family ``name`` and its protocol note."""
  paper = family(s, name)
  return [heading, "", intro, "", *report.verdict_rows(family(s, claims_lib.GATE)), "",
          outcome[0] if s["base_learned"] else outcome[1], "",
          *([note, ""] if note else []), *report.verdict_rows(paper), "",
          report.protocol_note(paper), ""]


@dataclasses.dataclass(frozen=True)
class Subtable:
  """A gated sub-table of a table judged on one metric (its summary from ``gated``): where its
  summary sits (``key`` in the table's summary; "": the summary itself), the first column of its
  rows (``label``), its arms {arm name: row label}, and its claims section (``claims_section``
  of family ``family``)."""

  key: str
  label: str
  arms: Mapping[str, str]
  family: str
  heading: str
  intro: str
  outcome: tuple[str, str]
  note: str | None = None

  def of(self, s: Mapping) -> Mapping | None:
    """Its summary in the table's summary ``s`` (None where it was not run)."""
    return s.get(self.key) if self.key else s


def gated_table(subs: Sequence[Subtable], s: Mapping, first: str, metric: str) -> list[str]:
  """The arms of every sub-table that ran, a row each: its ``first`` column, the arm, the cell of
  ``metric``, the gain over the SFT start, the final evaluation and the minutes."""
  return md_table(
      [first, "arm", f"{metric} (last-3 mean)", "gain over SFT", "final evaluation", "minutes"],
      [[sub.label, label, *(report.fmt(t[k][n]) for k in ("cells", "gains", "final_eval")),
        report.minutes(t["arm_seconds"][n])]
       for sub in subs if (t := sub.of(s)) for n, label in sub.arms.items()])


def gated_sections(subs: Sequence[Subtable], s: Mapping) -> list[str]:
  """The claims sections of the sub-tables that ran, then the rules of all their claims."""
  ran = [(sub, sub.of(s)) for sub in subs if sub.of(s)]
  return [*(line for sub, t in ran for line in claims_section(
      t, sub.family, sub.heading, sub.intro, sub.outcome, sub.note)),
          report.rules_note([c for _, t in ran for c in t["claims"]]), ""]


def cpu_only(what: str) -> str:
  """The sentence in place of an analysis that full-size runs do not carry."""
  return f"{what} is measured on the CPU SFT policy only; full-size runs do not carry it."


def sub_outcome(passed: str, failed: str) -> tuple[str, str]:
  """(passed, failed): the sentences under a secondary sub-table's gate."""
  return f"Gate passed: {passed}.", f"**Gate failed** {failed}: the claims below are not judged."


def pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def save(fig, out_dir: str, name: str) -> str:
  """Write ``fig`` as ``out_dir/name`` and close it; returns the path."""
  import matplotlib.pyplot as plt

  path = os.path.join(out_dir, name)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def smoothed(ax, arm: Mapping, key: str, **kw):
  """A training metric's mean over seeds at every step, as a running mean over a twentieth of
  the run."""
  v = np.asarray(arm["train"][key]).mean(axis=1)
  w = max(1, len(v) // 20)
  ax.plot(np.arange(w, len(v) + 1), np.convolve(v, np.ones(w) / w, "valid"), **kw)


def curve(ax, arm: Mapping, key: str, **kw):
  """An arm's metric at each evaluation, the mean over its seeds."""
  ax.plot([e["step"] for e in arm["evals"]],
          [np.mean([x[key] for x in e["per_seed"]]) for e in arm["evals"]], **kw)


def curves_plot(results: Mapping, lines: Mapping[str, Mapping], key: str, ylabel: str,
                out_dir: str, name: str, figsize: tuple[float, float] = (6, 3.6)) -> str:
  """Metric ``key`` at each evaluation (``curve``) of each arm of ``lines`` {arm: its line's
  keywords}, on one panel."""
  fig, ax = pyplot().subplots(figsize=figsize)
  for n, kw in lines.items():
    curve(ax, results[n], key, **kw)
  ax.set(xlabel="RL step", ylabel=ylabel)
  ax.legend(fontsize=6)
  ax.grid(alpha=0.3)
  return save(fig, out_dir, name)


def passk_axes(ax, ks: Sequence[int], cells_: Mapping, start: Mapping, suffix: str = "",
               width=None):
  """pass@k against k (log 2) with error bars over seeds for each arm, and the SFT start;
  ``width(name)``: an arm's line width."""
  for n, c in cells_.items():
    kw = {} if width is None else {"lw": width(n)}
    report.errorbars(ax, ks, [c[f"pass@{k}{suffix}"] for k in ks], label=n, capsize=2, **kw)
  ax.plot(ks, [start[f"pass@{k}{suffix}"] for k in ks], "k:", label="SFT start")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("k")
  ax.grid(alpha=0.3)


def passk_figure(s: Mapping, out_dir: str, figsize: tuple[float, float],
                 panels: Sequence[tuple[str, str | None]] = (("", None),), width=None,
                 name: str = "passk.png") -> str:
  """pass@k against k of every arm of summary ``s`` (its "ks", "cells" and "start"), a panel per
  (metric suffix, title) of ``panels`` (``passk_axes``)."""
  fig, axes = pyplot().subplots(1, len(panels), figsize=figsize, squeeze=False)
  for ax, (suffix, title) in zip(axes[0], panels):
    passk_axes(ax, s["ks"], s["cells"], s["start"], suffix, width)
    if title:
      ax.set_title(title)
  axes[0][0].set_ylabel("test pass@k (last-3 mean)")
  axes[0][0].legend(fontsize=7)
  return save(fig, out_dir, name)


def advantage_mass_section(curve: Mapping, labels: Mapping[str, str], n: int) -> list[str]:
  """The table of ``rl_seeds.advantage_mass``'s ``curve`` on the SFT policy: the groups at each
  accuracy level and a row per recipe (``labels``: {recipe: its advantage in words})."""
  return [f"## Cumulative |advantage| per group vs group accuracy (SFT policy, N={n})", "",
          *md_table(["accuracy", *(f"{a:.3g}" for a in curve["accuracy"])], [
              ["groups", *map(str, curve["groups"])],
              *([f"sum abs(A), {label}", *(f"{v:.2f}" for v in curve[name])]
                for name, label in labels.items())]), ""]


def advantage_mass_plot(curve: Mapping, labels: Mapping[str, str], out_dir: str,
                        name: str = "cumulative_advantage.png") -> str:
  """``rl_seeds.advantage_mass``'s ``curve``: a line per recipe (``labels``: {recipe: legend})."""
  fig, ax = pyplot().subplots(figsize=(4.8, 3.4))
  for (recipe, label), style in zip(labels.items(), ("o-", "s--", "^:", "v-.")):
    ax.plot(curve["accuracy"], curve[recipe], style, label=label)
  ax.set(xlabel="group accuracy", ylabel="cumulative |advantage| of the group")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return save(fig, out_dir, name)


def sign_flips(report_: Mapping, key: str = "sign_flips") -> dict | None:
  """The analysis ``rl_seeds.fresh_group_sign_flips`` of a report's data under ``key``, its G keys
  back to integers (JSON keeps them as strings); None where the data has none (full-size runs)."""
  if key not in report_["data"]:
    return None
  return {k: {n: {int(g): v for g, v in d.items()} for n, d in r.items()}
          for k, r in report_["data"][key].items()}


def sign_flip_section(flips: Mapping | None, labels: Mapping[str, str], gs: Sequence[int],
                      prompts: int, reference: int, pool: int) -> list[str]:
  """The table of ``rl_seeds.fresh_group_sign_flips``'s rates ``flips`` (its ``prompts``,
  ``reference`` and ``pool``): a row per reward kind and recipe (named ``labels[recipe]``), the
  opposite / zeroed / correct rates at each G of ``gs``; none without ``flips``."""
  return [] if flips is None else [
      "## Advantage sign flips on the SFT policy", "",
      f"Reference: the mean reward of {reference} samples per prompt, {prompts} prompts; groups "
      f"cut from a separate pool of {pool} fresh completions per prompt. Over rollouts that reach "
      "the loss and whose reward differs from the reference: opposite sign(A) = -sign(r - b), "
      "zeroed A = 0, correct sign the rest.", "",
      *md_table(["reward", "baseline", *(f"G={g} opposite / zeroed / correct" for g in gs)],
                [[kind, labels[n], *(" / ".join(f"{per[n][g][k]:.3f}" for k in (
                    "opposite", "zeroed", "correct")) for g in gs)]
                 for kind, per in flips.items() for n in per])]


def sign_flip_plot(flips: Mapping | None, gs: Sequence[int], out_dir: str,
                   name: str = "sign_flips.png") -> list[str]:
  """[path]: the opposite and zeroed rates of ``flips`` (``sign_flip_section``) against G, a
  panel per reward kind; [] without ``flips``."""
  if flips is None:
    return []
  fig, axes = pyplot().subplots(1, len(flips), figsize=(8, 3.2), sharey=True, squeeze=False)
  axes = axes[0]
  for ax, (kind, per) in zip(axes, flips.items()):
    for n, rates in per.items():
      ax.plot(gs, [rates[g]["opposite"] for g in gs], "o-", label=f"{n}: opposite")
      ax.plot(gs, [rates[g]["zeroed"] for g in gs], "s--", label=f"{n}: zeroed")
    ax.set(title=f"{kind} reward", xlabel="G")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("fraction of counted rollouts")
  axes[0].legend(fontsize=6)
  return [save(fig, out_dir, name)]


def sign_flip_verdict(s: dict, claim: claims_lib.Claim, flips: Mapping | None, kind: str, g: int,
                      names: Sequence[str], key: str = "rates") -> dict:
  """``s`` with ``s[key]``: ``claims.judge_proportions`` of ``claim`` (its arms "<recipe>
  G=<g>") on the opposite-sign rates of ``flips`` (``sign_flips``), pooled over rollouts:
  recipes ``names`` at G ``g`` on reward ``kind``, its verdict among ``s["verdicts"]`` (``s[key]``
  None without ``flips``: full-size runs)."""
  s[key] = None if flips is None else claims_lib.judge_proportions(claim, {
      f"{n} G={g}": (flips[kind][n][g]["opposite"], flips[kind][n][g]["count"]) for n in names})
  if s[key]:
    s["verdicts"][claim.id] = s[key]["verdict"]
  return s


def sign_flip_verdict_rows(r: Mapping | None, flips: Mapping | None, kind: str, g: int,
                           names: Sequence[str], what: str) -> list[str]:
  """The rows and note of ``sign_flip_verdict``'s ``r`` (``what``: the claim in words), or the
  sentence that full-size runs do not carry it."""
  if r is None:
    return [cpu_only(f"{what} (opposite-sign rates)"), ""]
  return [*report.proportions_rows(r, [flips[kind][n][g]["opposite"] for n in names], "rollouts"),
          "", report.proportions_note(
              r, f"{what} compares opposite-sign rates pooled over rollouts",
              "from the \"Advantage sign flips\" table, fresh groups", "rollouts",
              "groups of the same prompts"), ""]


# --------------------------------------------------------------------------------- full size
def full_runs(table: str, runs_dir: str, arms: Mapping[str, dict], select,
              required: Sequence[str]) -> dict:
  """``runs.collect_runs`` of the arms ``select`` of a full.py ``FULL``; RunsError naming the
  ``required`` arms without runs."""
  found = runs.collect_runs(runs_dir, arms, select=set(select))
  missing = [n for n in required if n not in found]
  if missing:
    raise runs.RunsError(f"{table} --full: no runs under {runs_dir} for arm(s) "
                         f"{', '.join(missing)}")
  return found


def check_prefix(table: str, prefix: str, prefixes: Sequence[str] = ("",)):
  """RunsError unless ``--prefix`` ``prefix`` is one of ``prefixes`` (("",): none is taken)."""
  if prefix not in prefixes:
    raise runs.RunsError(
        f"{table} --full: " + (f"--prefix must be {' or '.join(map(repr, prefixes))} (one "
                               f"dataset per table), got {prefix!r}" if any(prefixes) else
                               f"the table has one set of arms, no --prefix (got {prefix!r})"))


def from_full(table: str, runs_dir: str, full: Mapping[str, dict], arms: Mapping[str, str],
              design: Design, ref: str, fields, setting, *, required: Sequence[str] | None = None,
              label: str = "full size", nest: bool = True) -> tuple[dict, dict]:
  """Full-size runs as a table's (config, data): the runs of ``arms`` {arm of ``full`` (a
  full.py ``FULL``): the table arm it stands for} (``full_runs``; every arm of ``required``, all
  by default, must have runs); the config is ``design`` at the steps and evaluation of table arm
  ``ref``'s config, the fewest seeds of any arm, the stated power plan
  (``experiments/full_size.py``) and the fields ``fields(cfgs)``, ``cfgs`` being {table arm:
  config} of the arms found; its setting reads "``label`` (experiments/``table``/full.py:
  ``setting(design, cfgs)``)" with the seeds per arm where they differ (``uneven``). The data
  holds the arms found, in the order of ``arms``, under "arms" (``nest``) or as itself."""
  from experiments.full_size import power_fields

  found = full_runs(table, runs_dir, full, arms, list(arms) if required is None else required)
  data = {arms[n]: found[n] for n in arms if n in found}
  cfgs, cfg = {n: r["config"] for n, r in data.items()}, data[ref]["config"]
  d = dataclasses.replace(
      design, seeds=min(len(r["seeds"]) for r in data.values()), steps=cfg["steps"],
      eval_every=cfg["eval_every"], eval_problems=cfg["eval_problems"],
      eval_samples=cfg["eval_samples"], **power_fields(), **fields(cfgs))
  seeds = {n: len(r["seeds"]) for n, r in data.items()}
  d = dataclasses.replace(d, setting=f"{label} (experiments/{table}/full.py: "
                          f"{setting(d, cfgs)}{uneven(seeds)})")
  return dataclasses.asdict(d), {"arms": data} if nest else data


def uneven(seeds: Mapping[str, int]) -> str:
  """The setting's note when arms have different seed counts."""
  return ("" if len(set(seeds.values())) == 1 else
          f"; seeds per arm {seeds}, the header gives the fewest")
