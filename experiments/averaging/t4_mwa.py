"""T4: metric-weighted averaging (MWA) vs the uniform average vs the last checkpoint.

Paper: Choi & Yu 2025 (MWA for PEFT checkpoints: weights from training loss or step with one
penalty p; "loss-weighted merging often yields the best results ... higher than the uniform merge
and even surpassing the final individual checkpoint"). Here every checkpoint of the run (one
per eval step) is merged; the loss of a checkpoint is the mean training loss of the steps since
the previous one (what a run logs); f = loss^-p or step^p (``rlpost.averaging.weights``; p = 0 is
the uniform average). Numbers: ``results/averaging/results.json`` ("t4").
"""

from __future__ import annotations


from experiments.averaging import report as R


def compute(data: dict, cfg) -> dict:
  ev, mwa = data["evals"], data["mwa"]
  loss_keys = [k for k in mwa if k.startswith("loss_p") and k != "loss_p0"]
  rows = []
  for sched, lr in R.settings(data):
    idx = R.run_index(data, sched, lr)
    cells = {"last": R.ci(ev[idx, -1, 0]), "uniform": R.ci(mwa["loss_p0"][idx])}
    cells.update({k: R.ci(v[idx]) for k, v in mwa.items() if k != "loss_p0"})
    cells["lawa"] = R.ci(ev[idx, -1, R.method_index(data, f"lawa_nu{cfg.lawa_main_nu}")])
    best = min(loss_keys, key=lambda k: mwa[k][idx].mean())
    rows.append({"schedule": sched, "lr": lr, "cells": cells, "best_loss_p": best,
                 "vs_uniform": R.diff_ci(mwa["loss_p0"][idx], mwa[best][idx]),
                 "vs_last": R.diff_ci(ev[idx, -1, 0], mwa[best][idx])})
  const = [r for r in rows if r["schedule"] == "constant"]
  weakest_u = min(const, key=lambda r: r["vs_uniform"]["lo"])
  weakest_l = max(const, key=lambda r: r["vs_last"]["mean"])
  return {"rows": rows, "weights_run0": data.get("mwa_weights_run0"), "claims": [
      {"id": "mwa_loss_beats_uniform", "paper": "Choi & Yu 2025: loss-weighted MWA beats the "
       "uniform average of the checkpoints",
       "where": f"every constant LR, p tuned (weakest: LR {weakest_u['lr']:g}, "
                f"{weakest_u['best_loss_p']}): uniform minus MWA",
       "effect": weakest_u["vs_uniform"]},
      {"id": "mwa_loss_beats_last", "paper": "Choi & Yu 2025: loss-weighted MWA can surpass the "
       "final checkpoint",
       "where": f"best constant LR for MWA (LR {weakest_l['lr']:g}, {weakest_l['best_loss_p']}): "
                "last checkpoint minus MWA",
       "effect": weakest_l["vs_last"]}]}


def markdown(res: dict) -> str:
  keys = list(res["rows"][0]["cells"])
  label = {"last": "last checkpoint", "uniform": "uniform (p=0)", "lawa": "LAWA (reference)"}
  head = ["LR"] + [label.get(k, k.replace("_p", " p=")) for k in keys] + ["best loss p: uniform - MWA"]
  rows = [[R.lr_label(r["schedule"], r["lr"])] + [R.fmt(r["cells"][k]) for k in keys]
          + [f"{r['best_loss_p']}: {R.fmt(R.signed(r['vs_uniform']))}"] for r in res["rows"]]
  return ("### T4. MWA over all checkpoints: final excess loss (nats; mean [95% CI])\n\n"
          + R.markdown_table(head, rows))
