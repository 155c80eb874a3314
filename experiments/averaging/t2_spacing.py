"""T2: gain of LAWA over the raw checkpoint against the spacing nu between averaged checkpoints.

Paper: Sanyal et al. 2023 ("these gains are amplified when checkpoints are sampled with
considerable spacing in training steps"). k fixed; nu in the sweep's ``lawa_nus``; constant LR.
Claim (pre-declared metric: the final excess loss): at the highest constant LR, LAWA with the
widest spacing below LAWA with the tightest (paired: two averages of the same runs).
"""

from __future__ import annotations

from experiments import harness
from experiments.averaging import report as R
from experiments.averaging.t1_lr_gain import FRACTIONS, SANYAL


def compute(data: dict, cfg, claims: R.Claims) -> dict:
  ev, acc = data["evals"], data["evals_acc"]
  rows = []
  for sched, lr in R.settings(data):
    if sched != "constant":
      continue
    idx = R.run_index(data, sched, lr)
    for nu in cfg.lawa_nus:
      m = R.method_index(data, f"lawa_nu{nu}")
      rows.append({"lr": lr, "nu": nu, "gain": {
          f"{int(f * 100)}%": R.gain(ev[idx, R.step_index(data, f), 0],
                                     ev[idx, R.step_index(data, f), m]) for f in FRACTIONS},
          "accuracy": harness.cell(acc[idx, -1, m])})
  best = {}
  for lr in sorted({r["lr"] for r in rows}):
    sub = [r for r in rows if r["lr"] == lr]
    best[f"{lr:g}"] = {k: max(sub, key=lambda r: r["gain"][k]["mean"])["nu"] for k in sub[0]["gain"]}
  hi = max(r["lr"] for r in rows)
  idx = R.run_index(data, "constant", hi)
  wide, tight = max(cfg.lawa_nus), min(cfg.lawa_nus)
  mw, mt = R.method_index(data, f"lawa_nu{wide}"), R.method_index(data, f"lawa_nu{tight}")
  claims.add("spacing_amplifies_gain",
             f"{SANYAL}: larger spacing between averaged checkpoints amplifies the gain (LAWA "
             f"nu={wide} vs nu={tight}, LR {hi:g})",
             {f"LAWA nu={wide}, LR {hi:g}": ev[idx, -1, mw],
              f"LAWA nu={tight}, LR {hi:g}": ev[idx, -1, mt]}, direction="less", family=SANYAL)
  return {"k": cfg.lawa_k, "rows": rows, "best_nu": best}


def markdown(res: dict) -> str:
  fr = list(res["rows"][0]["gain"])
  head = ["LR", "nu"] + [f"gain @ {k}" for k in fr] + ["LAWA accuracy (final)"]
  rows = [[f"{r['lr']:g}", str(r["nu"])] + [harness.fmt(r["gain"][k]) for k in fr]
          + [harness.fmt(r["accuracy"], 4)] for r in res["rows"]]
  best = "; ".join(f"LR {lr}: " + ", ".join(f"{k} nu={v}" for k, v in b.items())
                   for lr, b in res["best_nu"].items())
  return (f"## T2. LAWA (k={res['k']}) gain vs spacing nu (constant LR)\n\n"
          "Gain = raw - LAWA (nats; positive: LAWA better); mean [95% t interval of the paired "
          "per-seed gains]; accuracy: expected next-token accuracy.\n\n"
          + R.markdown_table(head, rows) + f"\n\nBest spacing by mean gain: {best}.")
