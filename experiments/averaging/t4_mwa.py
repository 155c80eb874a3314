"""T4: metric-weighted averaging (MWA) vs the uniform average vs the last checkpoint.

Paper: Choi & Yu 2025 (MWA for PEFT checkpoints: weights from training loss or step with one
penalty p; "loss-weighted merging often yields the best results ... higher than the uniform merge
and even surpassing the final individual checkpoint"). Here every checkpoint of the run (one
per eval step) is merged; the loss of a checkpoint is the mean training loss of the steps since
the previous one (what a run logs); f = loss^-p or step^p (``rlpost.averaging.weights``; p = 0 is
the uniform average). Claims (pre-declared metric: the excess loss of the merge, against the last
checkpoint's final excess loss; paired, all from the same runs; family Choi & Yu 2025):
loss-weighted MWA (p with the lowest mean loss) below the uniform merge at every constant LR, and
below the last checkpoint at the highest constant LR.
"""

from __future__ import annotations

from experiments import harness
from experiments.averaging import report as R

CHOI = "Choi & Yu 2025"


def compute(data: dict, cfg, claims: R.Claims) -> dict:
  ev, mwa = data["evals"], data["mwa"]
  loss_keys = [k for k in mwa if k.startswith("loss_p") and k != "loss_p0"]
  rows = []
  for sched, lr in R.settings(data):
    idx = R.run_index(data, sched, lr)
    cells = {"last": harness.cell(ev[idx, -1, 0]), "uniform": harness.cell(mwa["loss_p0"][idx])}
    cells.update({k: harness.cell(v[idx]) for k, v in mwa.items() if k != "loss_p0"})
    cells["lawa"] = harness.cell(ev[idx, -1, R.method_index(data, f"lawa_nu{cfg.lawa_main_nu}")])
    best = min(loss_keys, key=lambda k: mwa[k][idx].mean())
    rows.append({"schedule": sched, "lr": lr, "cells": cells, "best_loss_p": best,
                 "vs_uniform": R.gain(mwa["loss_p0"][idx], mwa[best][idx]),
                 "vs_last": R.gain(ev[idx, -1, 0], mwa[best][idx])})
  const = [r for r in rows if r["schedule"] == "constant"]
  for r in const:
    idx, lr, best = R.run_index(data, "constant", r["lr"]), r["lr"], r["best_loss_p"]
    claims.add(f"mwa_loss_beats_uniform_lr{lr:g}",
               f"{CHOI}: loss-weighted MWA beats the uniform average of the checkpoints "
               f"(constant LR {lr:g})",
               {f"MWA {best.replace('_p', ' p=')}, LR {lr:g}": mwa[best][idx],
                f"uniform, LR {lr:g}": mwa["loss_p0"][idx]}, direction="less", family=CHOI)
  r = const[-1]
  idx, lr, best = R.run_index(data, "constant", r["lr"]), r["lr"], r["best_loss_p"]
  claims.add("mwa_loss_beats_last",
             f"{CHOI}: loss-weighted MWA can surpass the final checkpoint (highest constant LR, "
             f"{lr:g})",
             {f"MWA {best.replace('_p', ' p=')}, LR {lr:g}": mwa[best][idx],
              f"last checkpoint, LR {lr:g}": ev[idx, -1, 0]}, direction="less", family=CHOI)
  return {"rows": rows, "weights_run0": data.get("mwa_weights_run0")}


def markdown(res: dict) -> str:
  keys = list(res["rows"][0]["cells"])
  label = {"last": "last checkpoint", "uniform": "uniform (p=0)", "lawa": "LAWA (reference)"}
  head = (["LR"] + [label.get(k, k.replace("_p", " p=")) for k in keys]
          + ["best loss p: uniform - MWA", "last - MWA"])
  rows = [[R.lr_label(r["schedule"], r["lr"])] + [harness.fmt(r["cells"][k]) for k in keys]
          + [f"{r['best_loss_p']}: {harness.fmt(r['vs_uniform'])}", harness.fmt(r["vs_last"])]
          for r in res["rows"]]
  return ("## T4. MWA over all checkpoints: final excess loss (nats; mean [95% t interval]; "
          "differences: paired by seed)\n\n" + R.markdown_table(head, rows))
