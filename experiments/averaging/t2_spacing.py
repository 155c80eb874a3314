"""T2: gain of LAWA over the raw checkpoint against the spacing nu between averaged checkpoints.

Paper: Sanyal et al. 2023 ("these gains are amplified when checkpoints are sampled with
considerable spacing in training steps"). k fixed; nu in the sweep's ``lawa_nus``; constant LR.
Numbers: ``results/averaging/results.json`` ("t2").
"""

from __future__ import annotations

from experiments.averaging import report as R
from experiments.averaging.t1_lr_gain import FRACTIONS


def compute(data: dict, cfg) -> dict:
  ev = data["evals"]
  rows = []
  for sched, lr in R.settings(data):
    if sched != "constant":
      continue
    idx = R.run_index(data, sched, lr)
    for nu in cfg.lawa_nus:
      m = R.method_index(data, f"lawa_nu{nu}")
      rows.append({"lr": lr, "nu": nu, "gain": {
          f"{int(f * 100)}%": R.diff_ci(ev[idx, R.step_index(data, f), 0],
                                        ev[idx, R.step_index(data, f), m]) for f in FRACTIONS}})
  best = {}
  for lr in sorted({r["lr"] for r in rows}):
    sub = [r for r in rows if r["lr"] == lr]
    best[f"{lr:g}"] = {k: max(sub, key=lambda r: r["gain"][k]["mean"])["nu"] for k in sub[0]["gain"]}
  hi = max(r["lr"] for r in rows)
  idx = R.run_index(data, "constant", hi)
  wide, tight = max(cfg.lawa_nus), min(cfg.lawa_nus)
  mw, mt = R.method_index(data, f"lawa_nu{wide}"), R.method_index(data, f"lawa_nu{tight}")
  effect = R.diff_ci(ev[idx, -1, mt], ev[idx, -1, mw])  # positive: wide spacing better
  return {"k": cfg.lawa_k, "rows": rows, "best_nu": best, "claims": [
      {"id": "spacing_amplifies_gain", "paper": "Sanyal et al. 2023: larger spacing between "
       "averaged checkpoints amplifies the gain",
       "where": f"final step, LR {hi:g}: LAWA nu={wide} minus nu={tight} (loss reduction)",
       "effect": effect}]}


def markdown(res: dict) -> str:
  fr = list(res["rows"][0]["gain"])
  head = ["LR", "nu"] + [f"gain @ {k}" for k in fr]
  rows = [[f"{r['lr']:g}", str(r["nu"])] + [R.fmt(R.signed(r["gain"][k])) for k in fr]
          for r in res["rows"]]
  best = "; ".join(f"LR {lr}: " + ", ".join(f"{k} nu={v}" for k, v in b.items())
                   for lr, b in res["best_nu"].items())
  return (f"### T2. LAWA (k={res['k']}) gain vs spacing nu (constant LR)\n\n"
          + R.markdown_table(head, rows) + f"\n\nBest spacing by mean gain: {best}.")
