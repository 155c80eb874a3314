"""``table.md`` and the PNG plots of the round-trip experiment, from ``results.json`` alone
(``harness.Experiment.render`` and ``plot``)."""

from __future__ import annotations

import os

import numpy as np

from experiments import harness
from experiments.roundtrip import claims as CL

SYSTEM_ORDER = ("kdv1d", "ns2d", "ks1d")  # fair tests first, then the stress test


def _empty(c) -> bool:
  return c is None or c.get("n", 0) == 0 or c.get("mean") is None


def _m(c: dict, digits: int = 3) -> str:
  return "—" if _empty(c) else f"{c['mean']:.{digits}f}"


def _ci(c: dict, digits: int = 2) -> str:
  return "—" if _empty(c) else harness.fmt(c, digits)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
  return "\n".join(["| " + " | ".join(r) + " |"
                    for r in [header, ["---"] * len(header), *rows]])


def _names(report: dict) -> list[str]:
  return [n for n in SYSTEM_ORDER if n in report["data"]["systems"]]


# ----------------------------------------------------------------------------- tables


def ranking_table(s: dict, depths) -> str:
  r = s["ranking"]
  u = s.get("undertrained")
  header = ["depth", "E_i", "no change (x_i := x_0)", "C_i", "C/E (median)",
            "Spearman(C,E) fixed depth", "latent C", "within traj. (mean +- std)",
            "sample spread", "spread (norm.)"]
  if u:
    header.append("undertrained model")
  rows = []
  for k, d in enumerate(depths):
    row = [str(d), _m(r["E_mean"][k]), _m(r["E_persistence"][k]), _m(r["C_mean"][k]),
           _m(r["C_over_E"][k], 2),
           _ci(r["rho_fixed"][k]), _m(r["rho_fixed_latent"][k], 2),
           f"{_m(r['rho_within'][k], 2)} +- {_m(r['rho_within_std'][k], 2)}",
           _ci(r["rho_disp"][k]), _m(r["rho_disp_norm"][k], 2)]
    if u:
      row.append(_ci(u["rho_fixed"][k]))
    rows.append(row)
  text = markdown_table(header, rows)
  text += (f"\n\nPooled over (rollout, depth) pairs (inflated by the shared depth trend, shown "
           f"only for contrast): trained {_ci(r['rho_pooled'])}")
  if u:
    text += f", undertrained {_ci(u['rho_pooled'])}"
  return text + "."


def calibration_table(s: dict, depths) -> str:
  cal = s["calibration"]
  header = ["calibrator (fit on training rollouts)", "sigma", "68% factor", "95% factor",
            "coverage 68%", "coverage 95%", "held-out NLL (nats)"]
  names = {"c_logdepth": "log C + log depth (main)", "c_depth": "log C + depth (linear)",
           "logdepth": "log depth only (baseline)", "depth": "depth only (linear)",
           "depth_onehot": "one mean per depth"}
  rows = [[names[n], _m(cal[n]["sigma"]), _m(cal[n]["factor68"], 2), _m(cal[n]["factor95"], 2),
           _ci(cal[n]["cov68"]), _ci(cal[n]["cov95"]), _ci(cal[n]["nll"])] for n in names]
  text = markdown_table(header, rows)
  main = cal["c_logdepth"]
  text += "\n\nPer depth (main calibrator), held-out:\n\n"
  text += markdown_table(
      ["depth"] + [str(d) for d in depths],
      [["coverage 68%"] + [_m(c, 2) for c in main["cov68_by_depth"]],
       ["coverage 95%"] + [_m(c, 2) for c in main["cov95_by_depth"]],
       ["NLL (main)"] + [_m(c, 2) for c in main["nll_by_depth"]],
       ["NLL (log depth only)"] + [_m(c, 2) for c in cal["logdepth"]["nll_by_depth"]]])
  return text


def ood_table(s: dict, depths) -> str:
  o = s["ood"]
  rows = [[str(d), _ci(o["C"][k]), _ci(o["disp"][k]), _ci(o["disp_norm"][k]), _m(o["E"][k], 2)]
          for k, d in enumerate(depths)]
  return markdown_table(["depth", "AUROC C_i", "sample spread (raw)", "spread (normalised)",
                         "true error E_i (reference)"], rows)


def selective_table(s: dict, depths, coverage: float) -> str:
  sel = s["selective"]
  b = sel["by_depth"]
  rows = [[str(d), _ci(b["C"][k]), _m(b["disp"][k]), _m(b["depth"][k]), _ci(b["oracle"][k])]
          for k, d in enumerate(depths)]
  p = sel["pooled"]
  rows.append(["pooled", f"{_ci(p['C_calibrated'])} (calibrated; raw C {_m(p['C_raw'])})", "—",
               _ci(p["depth"]), _ci(p["oracle"])])
  return (f"Error cut at {coverage:.0%} coverage (1 - kept mean error / mean error); the oracle "
          "ranks by the true error, the most any ranking can cut:\n\n" +
          markdown_table(["depth", "ranked by C_i", "sample spread", "depth only", "oracle"],
                         rows))


def direction_table(s: dict, depths) -> str:
  sp, inv = s["specialists"], s["inverse"]
  idx = [d - 1 for d in depths]
  header = ["depth", "forward: bidirectional", "forward: specialist", "backward / inverse: "
            "bidirectional", "backward: specialist", "inverse: x_0 := x_i"]
  rows = []
  for k, d in enumerate(depths):
    i = idx[k]
    rows.append([str(d), _m(sp["bidir_fwd"][i]),
                 _m(sp["forward_fwd"][i]) if "forward_fwd" in sp else "—",
                 _m(sp["bidir_bwd"][i]),
                 _m(sp["backward_bwd"][i]) if "backward_bwd" in sp else "—",
                 _m(inv["persistence"][k])])
  text = ("Mean relative L2 error of forward rollouts from the test starts, of backward rollouts "
          "from the true state i frames later (recovering x_0 from x_i), and of the trivial "
          "estimate x_0 := x_i:\n\n" + markdown_table(header, rows))
  if "gain_fwd" in sp:
    text += (f"\n\nOne step, log(specialist / bidirectional error): forward "
             f"{_ci(sp['gain_fwd_1step'])}, backward {_ci(sp['gain_bwd_1step'])}.")
  return text


def system_section(name: str, info: dict, s: dict, coverage: float) -> str:
  depths = info["depths"]
  return "\n".join([
      f"### {name} ({info['role']} test)\n", info["description"] + "\n",
      f"Model: {info['num_params']:,} parameters ({info['model']}), {info['steps']} training "
      f"steps at batch {info['batch_size']}; rollouts from {info['rollouts']}; sampler: "
      f"{info['sampler']}.\n",
      "**Ranking** (test rollouts; mean [95% t interval] over seeds):\n", ranking_table(s, depths),
      "\n**Calibration** (fit on training-set rollouts, evaluated on test rollouts):\n",
      calibration_table(s, depths),
      "\n**OOD detection** (OOD rollouts vs test rollouts from the same start times):\n",
      ood_table(s, depths), "\n**Selective prediction**\n",
      selective_table(s, depths, coverage),
      "\n**Directions**\n", direction_table(s, depths), ""])


# ----------------------------------------------------------------------------- the table


def _run_line(report: dict) -> str:
  cfg, mach = report["config"], report["machine"]
  roles = {n: s["role"] for n, s in report["data"]["systems"].items()}
  hardware = mach.get("hardware") or harness.machine_text(dict(mach, recorded=None))
  if mach.get("recorded") is False:
    hardware += ", as the pre-harness run recorded it"
  systems = report["data"]["systems"]
  n_units = sum(len(s["units"]) for s in systems.values())
  counts = {n: len(systems[n]["per_seed"]) for n in _names(report)}
  power = ""
  if cfg.get("pilot_sd") is not None:
    from rlpost.eval import stats

    need = max(cfg["min_seeds"], stats.seeds_needed(cfg["pilot_sd"], cfg["min_effect"]))
    power = (f" ({need} from power: pilot SD {cfg['pilot_sd']}, minimum effect "
             f"{cfg['min_effect']}, 80% power at alpha 0.05 by the two-sided two-sample "
             f"formula; floor {cfg['min_seeds']})")
  if len(set(counts.values())) == 1:
    seeds = f"{next(iter(counts.values()))} seeds per system{power}"
  else:  # the power note belongs to the systems run at the experiment's count
    seeds = "seeds: " + ", ".join(
        f"{n} {k}" + (power if k == cfg["seeds"] else " (capped: it decides nothing)"
                      if roles.get(n) == "stress" else " (capped)")
        for n, k in counts.items())
  paper = report["summary"]["verdicts"].get("paper", [])
  mdes = [v["mde"] for v in paper if v.get("mde") is not None and np.isfinite(v["mde"])]
  mde = (f" Minimum detectable effect of the paper's parts: {min(mdes):.3g}-{max(mdes):.3g} "
         "(each part's in its row)." if mdes else "")
  return (f"`{report['command']}`: {seeds} (model initialisation and training noise; data "
          f"fixed, dataset seed {cfg['data_seed']}); {report['unit_seconds'] / 60:.1f} min of "
          f"training and evaluation over {n_units} units ({hardware}).{mde} Cells: mean [95% "
          "Student-t interval over seeds].")


def _oracle_fails(claims: list[dict]) -> list[str]:
  """A line naming each claim whose rule an oracle ranking fails on some system (no test of C_i
  there), or nothing."""
  failed = [f"`{c['id']}` ({', '.join(c['oracle_fails'])})" for c in claims
            if c.get("oracle_fails")]
  if not failed:
    return []
  return [f"Oracle check not passed (not shown that any ranking can meet the rule there, so "
          f"the rule may not test C_i; see \"Sanity checks\"): {'; '.join(failed)}.", ""]


def _verdicts_table(claims: list[dict], names: list[str], roles: dict, control: bool) -> str:
  rows = [[f"`{c['id']}`", c["paper"], f"**{c['verdict']}**"]
          + [c["systems"].get(n, "n/a") for n in names]
          for c in claims if c["control"] == control]
  return markdown_table(["claim", "paper", "verdict"] + [f"{n} ({roles[n]})" for n in names],
                        rows)


def render(report: dict) -> str:
  s = report["summary"]
  systems = report["data"]["systems"]
  names = _names(report)
  roles = {n: systems[n]["role"] for n in names}
  fair = [n for n in names if roles[n] == "fair"]
  stress = [n for n in names if roles[n] == "stress"]
  deciding = s["deciding"]
  gate = {v["claim"]["arms"][0]: v for v in s["gate"]}
  fam = s["verdicts"]
  paper, controls = fam.get("paper", []), fam.get("controls", [])
  seeds = min((len(systems[n]["per_seed"]) for n in deciding), default=report["config"]["seeds"])
  excluded = ("Intervals cover seed-to-seed variation (model initialisation and training noise) "
              "only: every seed is evaluated on the same fixed test, training and OOD "
              "trajectories with the same evaluation noise keys, so they exclude the sampling "
              "error of the trajectories.")
  lines = [
      "# Round-trip consistency at CPU scale", "", _run_line(report), "",
      f"Fair tests: {', '.join(fair) or 'none'} (reversible or near-conservative: backward "
      f"stepping is well posed). Stress test: {', '.join(stress) or 'none'} (dissipative: "
      "backward stepping is ill posed, so C_i can measure the backward leg's divergence rather "
      "than the forward error). A fair test decides only when its model has learned the dynamics: "
      f"skill 1 - E_1 / E_1(no change) above {CL.SKILL_GATE} (one-sided t test at 5%, interval "
      f"above {CL.SKILL_GATE}); deciding here: {', '.join(deciding) or 'none'}.", "",
      markdown_table(["system", "role", "skill at depth 1 (1 - E_1 / no-change error)", "E_1",
                      "no-change error", "gate p", "decides"],
                     [[n, roles[n], _ci(s["systems"][n]["ranking"]["skill"]),
                       _m(s["systems"][n]["ranking"]["E_mean"][0]),
                       _m(s["systems"][n]["ranking"]["E_persistence"][0]),
                       f"{gate[n]['p']:.3g}" if n in gate else "—",
                       "yes" if n in deciding else "no"] for n in names]), "",
      "## Paper claims", "",
      f"Verdicts on the deciding systems ({', '.join(deciding) or 'none'}); the other systems' "
      "verdicts, in their own families, are shown beside and do not enter the verdict column. "
      "A claim of several parts is reproduced when every part is, not reproduced when any "
      "part is.", "",
      _verdicts_table(s["claims"], names, roles, control=False), "",
      *_oracle_fails(s["claims"]),
      f"Parts on the deciding systems: one Holm family, {seeds} seeds, one-sample "
      "claims about per-seed summaries (a - threshold). " + excluded, "",
      *harness.verdict_rows(paper), "",
      harness.protocol_note(paper) or "No system decides: every paper verdict is inconclusive.",
      "",
      harness.rules_note(paper) + " Rules made at every depth are judged on each seed's "
      "worst depth. A claim is *not testable* on a system where an oracle ranking (by the true "
      "error) is not shown to meet its rule (its parts keep their own verdicts; "
      f"``experiments/roundtrip/claims.py``). At {seeds} seeds the permutation p's smallest "
      f"value is 1/{2 ** seeds}" + (", too coarse to decide." if 2 ** seeds < 40 else "."), ""]
  for d in s["dropped"]:
    cells = "; ".join(f"{m}: " + ", ".join(f"{n} {_ci(c[n], 3)}" for n in names if n in c)
                      for m, c in d["cells"].items())
    lines += [f"Dropped: `{d['id']}` ({d['paper']}; old rule: {d['old_rule']}): {d['why']} "
              f"Intervals over seeds: {cells}.", ""]
  lines += ["## Weaker forms and controls (not claims of the paper)", "",
            _verdicts_table(s["claims"], names, roles, control=True), "",
            "Parts on the deciding systems (one Holm family):", "",
            *harness.verdict_rows(controls), ""]
  others = [n for n in names if n not in deciding]
  if others:
    lines += ["## Systems that do not decide", "",
              "The same parts on each system outside the verdict column (paper claims and "
              "controls each Holm-adjusted per system).", ""]
    for n in others:
      rows = fam.get(f"paper@{n}", []) + fam.get(f"controls@{n}", [])
      lines += [f"### {n} ({roles[n]} test)", "", *harness.verdict_rows(rows), ""]
  lines += ["## Sanity checks", "",
            "An oracle ranking (by the true error) must meet a selective-prediction rule for the "
            "rule to test C_i (statistics.md, point 6). The OOD rows score OOD by the true error "
            "E_i: a reference for how visible the shift is in the error, not a bound on C_i's "
            "AUROC, so they void no verdict.", ""]
  lines += harness.verdict_rows([v for n in names for v in fam.get(f"sanity@{n}", [])])
  lines += ["", "## Details per system", ""]
  for n in names:
    lines.append(system_section(n, systems[n], s["systems"][n], report["config"]["coverage"]))
  return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- plots


def _plt():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _no_minor_labels(ax) -> None:
  """Log axes label minor ticks too, which overlap on small panels."""
  from matplotlib.ticker import NullFormatter

  ax.xaxis.set_minor_formatter(NullFormatter())
  ax.yaxis.set_minor_formatter(NullFormatter())


def _save(fig, plt, out_dir: str, name: str) -> str:
  fig.tight_layout()
  path = os.path.join(out_dir, name)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_scatter(report: dict, out_dir: str) -> str:
  """C_i vs E_i on test rollouts (the first seed's kept sample), one panel per (system, depth)."""
  plt = _plt()
  systems = report["data"]["systems"]
  names = _names(report)
  ncol = max(len(systems[n]["depths"]) for n in names)
  fig, axes = plt.subplots(len(names), ncol, figsize=(2.6 * ncol, 2.5 * len(names)),
                           squeeze=False)
  for r, n in enumerate(names):
    sc, depths = systems[n]["scatter"], systems[n]["depths"]
    for k in range(ncol):
      ax = axes[r][k]
      if k >= len(depths):
        ax.axis("off")
        continue
      e, c = np.asarray(sc["E"][k]), np.asarray(sc["C"][k])
      ax.loglog(e, c, ".", ms=3, alpha=0.6)
      lim = [min(e.min(), c.min()), max(e.max(), c.max())]
      ax.plot(lim, lim, "k:", lw=0.8)
      rho = systems[n]["per_seed"][sc["seed"]]["ranking"]["rho_fixed"][k]
      ax.set_title(f"{n}, depth {depths[k]}: rho={rho:.2f}", fontsize=8)
      _no_minor_labels(ax)
      ax.tick_params(labelsize=7)
      if r == len(names) - 1:
        ax.set_xlabel("E_i (forward error)", fontsize=8)
      if k == 0:
        ax.set_ylabel("C_i (round trip)", fontsize=8)
  return _save(fig, plt, out_dir, "scatter.png")


def plot_risk_coverage(report: dict, out_dir: str) -> str:
  """Selective risk / full risk vs coverage (seed means) at the first and last depth and pooled."""
  plt = _plt()
  systems = report["data"]["systems"]
  names = _names(report)
  fig, axes = plt.subplots(len(names), 3, figsize=(9, 2.6 * len(names)), squeeze=False)
  for r, n in enumerate(names):
    depths = systems[n]["depths"]
    curves = [s["curves"] for s in systems[n]["per_seed"]]
    cov = curves[0]["coverage"]
    for k, (tag, title) in enumerate((("first", f"depth {depths[0]}"),
                                      ("last", f"depth {depths[-1]}"), ("pooled", "pooled"))):
      ax = axes[r][k]
      for name in curves[0][tag]:
        ax.plot(cov, np.mean([c[tag][name] for c in curves], axis=0), label=name)
      ax.axvline(report["config"]["coverage"], color="k", lw=0.6, ls=":")
      ax.set_title(f"{n}: {title}", fontsize=8)
      ax.set_ylim(bottom=0)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
      if r == len(names) - 1:
        ax.set_xlabel("coverage (kept fraction)", fontsize=8)
      if k == 0:
        ax.set_ylabel("kept mean error / all", fontsize=8)
      ax.legend(fontsize=6)
  return _save(fig, plt, out_dir, "risk_coverage.png")


def plot_calibration(report: dict, out_dir: str) -> str:
  """Predicted (median, 68% and 95% bands) vs observed test errors, the first seed, by depth."""
  plt = _plt()
  systems = report["data"]["systems"]
  names = _names(report)
  fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.2), squeeze=False)
  for ax, n in zip(axes[0], names):
    sc, depths = systems[n]["scatter"], systems[n]["depths"]
    for k, d in enumerate(depths):
      ax.loglog(sc["pred"][k], sc["E"][k], ".", ms=3, alpha=0.6, label=f"d={d}")
    lim = np.asarray(ax.get_xlim())
    f68, f95 = np.exp(sc["sigma"]), np.exp(1.959964 * sc["sigma"])
    ax.plot(lim, lim, "k-", lw=0.8)
    for f, style in ((f68, "--"), (f95, ":")):
      ax.plot(lim, lim * f, "k" + style, lw=0.7)
      ax.plot(lim, lim / f, "k" + style, lw=0.7)
    cov = systems[n]["per_seed"][sc["seed"]]["calibration"]["c_logdepth"]
    ax.set_title(f"{n}: x{f68:.2f} / x{f95:.2f}, cov {cov['cov68']:.2f} / {cov['cov95']:.2f}",
                 fontsize=8)
    _no_minor_labels(ax)
    ax.set_xlabel("predicted error (calibrator)", fontsize=8)
    ax.set_ylabel("observed E_i", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
  return _save(fig, plt, out_dir, "calibration.png")


def plot_directions(report: dict, out_dir: str) -> str:
  """Forward and backward (inverse) rollout error vs depth, bidirectional vs specialists, with
  t intervals over seeds."""
  plt = _plt()
  names = _names(report)
  fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.0), squeeze=False)
  for ax, n in zip(axes[0], names):
    sp = report["summary"]["systems"][n]["specialists"]
    for key, label, color, style in (("bidir_fwd", "forward, bidirectional", "C0", "-"),
                                     ("forward_fwd", "forward, specialist", "C0", "--"),
                                     ("bidir_bwd", "backward (inverse), bidirectional", "C1", "-"),
                                     ("backward_bwd", "backward, specialist", "C1", "--")):
      if key in sp:
        harness.errorbars(ax, np.arange(1, len(sp[key]) + 1), sp[key], color=color, ls=style,
                          marker=None, capsize=2, label=label)
    ax.set_yscale("log")
    ax.set_title(n, fontsize=9)
    ax.set_xlabel("depth", fontsize=8)
    ax.set_ylabel("relative L2 error", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  return _save(fig, plt, out_dir, "directions.png")


def plots(report: dict, out_dir: str) -> list[str]:
  """Every plot whose data ``report`` holds (a results.json without the first seed's scatter,
  written before it was kept, leaves the scatter and calibration plots as they are)."""
  out = [plot_risk_coverage(report, out_dir), plot_directions(report, out_dir)]
  if all("scatter" in s for s in report["data"]["systems"].values()):
    out += [plot_scatter(report, out_dir), plot_calibration(report, out_dir)]
  return out
