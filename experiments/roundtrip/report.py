"""Markdown tables and PNG plots of the round-trip experiment (from ``analysis`` summaries)."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from experiments.averaging import report as R
from experiments.roundtrip import analysis as A
from experiments.roundtrip import claims as CL

SYSTEM_ORDER = ("kdv1d", "ns2d", "ks1d")  # fair tests first, then the stress test


def _m(c: dict, digits: int = 3) -> str:
  if c is None or c["n"] == 0 or math.isnan(c["mean"]):
    return "—"
  return f"{c['mean']:.{digits}f}"


def _ci(c: dict, digits: int = 2) -> str:
  if c is None or c["n"] == 0 or math.isnan(c["mean"]):
    return "—"
  return R.fmt(c, digits)


def claims_table(claims: list[dict], systems: list[str], roles: dict[str, str],
                 control: bool) -> str:
  header = ["claim", "paper", "verdict"] + [f"{s} ({roles[s]})" for s in systems]
  rows = []
  for c in claims:
    if c["control"] != control:
      continue
    cells = []
    for s in systems:
      cell = c["systems"].get(s)
      cells.append("n/a" if cell is None else f"{cell['verdict']}: {cell['ours']}")
    rows.append([f"`{c['id']}`", c["paper"], f"**{c['verdict']}**"] + cells)
  return R.markdown_table(header, rows)


def rules_list(claims: list[dict]) -> str:
  return "\n".join(f"- `{c['id']}`: {c['rule']}." for c in claims)


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
  text = R.markdown_table(header, rows)
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
  text = R.markdown_table(header, rows)
  main = cal["c_logdepth"]
  text += "\n\nPer depth (main calibrator), held-out:\n\n"
  text += R.markdown_table(
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
  return R.markdown_table(["depth", "AUROC C_i", "sample spread (raw)", "spread (normalised)",
                           "true error E_i (reference)"], rows)


def selective_table(s: dict, depths, coverage: float) -> str:
  sel = s["selective"]
  b = sel["by_depth"]
  rows = [[str(d), _ci(b["C"][k]), _m(b["disp"][k]), _m(b["depth"][k]), _m(b["oracle"][k])]
          for k, d in enumerate(depths)]
  p = sel["pooled"]
  rows.append(["pooled", f"{_ci(p['C_calibrated'])} (calibrated; raw C {_m(p['C_raw'])})", "—",
               _m(p["depth"]), _m(p["oracle"])])
  return (f"Error cut at {coverage:.0%} coverage (1 - kept mean error / mean error):\n\n" +
          R.markdown_table(["depth", "ranked by C_i", "sample spread", "depth only", "oracle"],
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
          "estimate x_0 := x_i:\n\n" + R.markdown_table(header, rows))
  if "gain_fwd" in sp:
    text += (f"\n\nOne step, log(specialist / bidirectional error): forward "
             f"{_ci(sp['gain_fwd_1step'])}, backward {_ci(sp['gain_bwd_1step'])}.")
  return text


def system_section(name: str, info: dict, coverage: float) -> str:
  s, depths = info["summary"], info["depths"]
  parts = [f"### {name} ({info['role']} test)\n", info["description"] + "\n",
           f"Model: {info['num_params']:,} parameters ({info['model']}), {info['steps']} training "
           f"steps at batch {info['batch_size']}; rollouts from {info['rollouts']}; sampler: "
           f"{info['sampler']}.\n",
           "**Ranking** (test rollouts; mean [95% CI] over seeds):\n", ranking_table(s, depths),
           "\n**Calibration** (fit on training-set rollouts, evaluated on test rollouts):\n",
           calibration_table(s, depths),
           "\n**OOD detection** (OOD rollouts vs test rollouts from the same start times):\n",
           ood_table(s, depths), "\n**Selective prediction**\n",
           selective_table(s, depths, coverage),
           "\n**Directions**\n", direction_table(s, depths), ""]
  return "\n".join(parts)


def markdown(meta: dict, systems: dict[str, dict], claims: list[dict], coverage: float) -> str:
  names = [n for n in SYSTEM_ORDER if n in systems]
  roles = {n: systems[n]["role"] for n in names}
  fair = [n for n in names if roles[n] == "fair"]
  stress = [n for n in names if roles[n] == "stress"]
  deciding = CL.deciding_systems({n: systems[n]["summary"] for n in names}, roles)
  parts = [
      f"## Results ({meta['mode']} run)\n",
      f"Command: `{meta['command']}`  \nHardware: {meta['hardware']}  \n"
      f"Runtime: {meta['seconds']['units']:.0f} s of training and evaluation (summed over the "
      f"{meta['num_units']} units); this invocation: {meta['seconds']['total']:.0f} s, "
      f"{meta['num_cached']} units loaded from the cache  \n"
      f"Seeds: {meta['seeds']} (model initialisation and training noise; data fixed, dataset "
      f"seed {meta['data_seed']}); intervals are 95% bootstrap CIs of the mean over seeds.\n",
      f"Fair tests: {', '.join(fair) or 'none'} (reversible or near-conservative: backward "
      f"stepping is well posed). Stress test: {', '.join(stress) or 'none'} (dissipative: "
      "backward stepping is ill posed, so C_i can measure the backward leg's divergence rather "
      "than the forward error). The verdict column combines the fair tests whose model has "
      f"learned the dynamics (skill 1 - E_1 / E_1(no change) with its CI above "
      f"{CL.SKILL_GATE}); deciding here: {', '.join(deciding) or 'none'}.\n",
      R.markdown_table(["system", "role", "skill at depth 1 (1 - E_1 / no-change error)",
                        "E_1", "no-change error", "decides"],
                       [[n, roles[n], _ci(systems[n]["summary"]["ranking"]["skill"]),
                         _m(systems[n]["summary"]["ranking"]["E_mean"][0]),
                         _m(systems[n]["summary"]["ranking"]["E_persistence"][0]),
                         "yes" if n in deciding else "no"] for n in names]) + "\n",
      "### Claims of the paper\n",
      claims_table(claims, names, roles, control=False),
      "\n### Weaker forms and controls (not claims of the paper)\n",
      claims_table(claims, names, roles, control=True),
      "\nRules (computed in `experiments/roundtrip/claims.py`; reproduced = the CI clears the "
      "threshold, not reproduced = it lies entirely on the wrong side, inconclusive otherwise):\n",
      rules_list(claims), ""]
  for n in names:
    parts.append(system_section(n, systems[n], coverage))
  return "\n".join(parts)


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


def plot_scatter(systems: dict[str, dict], first_units: dict[str, dict], out_dir: str) -> str:
  """C_i vs E_i on test rollouts, one panel per (system, depth), first seed."""
  plt = _plt()
  names = [n for n in SYSTEM_ORDER if n in systems]
  ncol = max(len(systems[n]["depths"]) for n in names)
  fig, axes = plt.subplots(len(names), ncol, figsize=(2.6 * ncol, 2.5 * len(names)),
                           squeeze=False)
  for r, n in enumerate(names):
    a, depths = first_units[n]["bidir"], systems[n]["depths"]
    for k in range(ncol):
      ax = axes[r][k]
      if k >= len(depths):
        ax.axis("off")
        continue
      e, c = A._floor(a["test_E"][:, k]), A._floor(a["test_C"][:, k])
      ax.loglog(e, c, ".", ms=3, alpha=0.6)
      lim = [min(e.min(), c.min()), max(e.max(), c.max())]
      ax.plot(lim, lim, "k:", lw=0.8)
      rho = systems[n]["per_seed"][0]["ranking"]["rho_fixed"][k]
      ax.set_title(f"{n}, depth {depths[k]}: rho={rho:.2f}", fontsize=8)
      _no_minor_labels(ax)
      ax.tick_params(labelsize=7)
      if r == len(names) - 1:
        ax.set_xlabel("E_i (forward error)", fontsize=8)
      if k == 0:
        ax.set_ylabel("C_i (round trip)", fontsize=8)
  fig.tight_layout()
  path = os.path.join(out_dir, "scatter.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_risk_coverage(systems: dict[str, dict], out_dir: str) -> str:
  """Selective risk / full risk vs coverage (seed means) at the first and last depth and pooled."""
  plt = _plt()
  names = [n for n in SYSTEM_ORDER if n in systems]
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
      ax.axvline(0.8, color="k", lw=0.6, ls=":")
      ax.set_title(f"{n}: {title}", fontsize=8)
      ax.set_ylim(bottom=0)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
      if r == len(names) - 1:
        ax.set_xlabel("coverage (kept fraction)", fontsize=8)
      if k == 0:
        ax.set_ylabel("kept mean error / all", fontsize=8)
      ax.legend(fontsize=6)
  fig.tight_layout()
  path = os.path.join(out_dir, "risk_coverage.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_calibration(systems: dict[str, dict], first_units: dict[str, dict], out_dir: str) -> str:
  """Predicted (median, 68% and 95% bands) vs observed test errors, first seed, by depth."""
  plt = _plt()
  names = [n for n in SYSTEM_ORDER if n in systems]
  fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.2), squeeze=False)
  for ax, n in zip(axes[0], names):
    a, depths = first_units[n]["bidir"], systems[n]["depths"]
    cal = A.fit_calibrators(a, depths)[A.MAIN_CALIBRATOR]
    for k, d in enumerate(depths):
      c = A._floor(a["test_C"][:, k])
      pred = cal.predict(c, np.full(c.shape, float(d)))
      ax.loglog(pred, A._floor(a["test_E"][:, k]), ".", ms=3, alpha=0.6, label=f"d={d}")
    lim = np.asarray(ax.get_xlim())
    f68, f95 = np.exp(cal.sigma), np.exp(1.959964 * cal.sigma)
    ax.plot(lim, lim, "k-", lw=0.8)
    for f, style in ((f68, "--"), (f95, ":")):
      ax.plot(lim, lim * f, "k" + style, lw=0.7)
      ax.plot(lim, lim / f, "k" + style, lw=0.7)
    cov = systems[n]["per_seed"][0]["calibration"][A.MAIN_CALIBRATOR]
    ax.set_title(f"{n}: x{f68:.2f} / x{f95:.2f}, cov {cov['cov68']:.2f} / {cov['cov95']:.2f}",
                 fontsize=8)
    _no_minor_labels(ax)
    ax.set_xlabel("predicted error (calibrator)", fontsize=8)
    ax.set_ylabel("observed E_i", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
  fig.tight_layout()
  path = os.path.join(out_dir, "calibration.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_directions(systems: dict[str, dict], out_dir: str) -> str:
  """Forward and backward (inverse) rollout error vs depth, bidirectional vs specialists."""
  plt = _plt()
  names = [n for n in SYSTEM_ORDER if n in systems]
  fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.0), squeeze=False)
  for ax, n in zip(axes[0], names):
    sp = systems[n]["summary"]["specialists"]
    for key, label, style in (("bidir_fwd", "forward, bidirectional", "C0-"),
                              ("forward_fwd", "forward, specialist", "C0--"),
                              ("bidir_bwd", "backward (inverse), bidirectional", "C1-"),
                              ("backward_bwd", "backward, specialist", "C1--")):
      if key in sp:
        ax.semilogy(np.arange(1, len(sp[key]) + 1), [c["mean"] for c in sp[key]], style,
                    label=label)
    ax.set_title(n, fontsize=9)
    ax.set_xlabel("depth", fontsize=8)
    ax.set_ylabel("relative L2 error", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  fig.tight_layout()
  path = os.path.join(out_dir, "directions.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plots(systems: dict[str, dict], first_units: dict[str, dict], out_dir: str) -> list[str]:
  return [plot_scatter(systems, first_units, out_dir), plot_risk_coverage(systems, out_dir),
          plot_calibration(systems, first_units, out_dir), plot_directions(systems, out_dir)]


def jsonable(x: Any) -> Any:
  from experiments.averaging import _jsonable

  return _jsonable(x)
