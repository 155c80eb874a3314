"""T4: metric-weighted averaging (MWA) of the last checkpoints vs their uniform average vs the
last checkpoint.

Paper: Choi & Yu 2025 (MWA for PEFT checkpoints: weights from training loss or step with one
penalty p; "loss-weighted merging often yields the best results ... higher than the uniform merge
and even surpassing the final individual checkpoint"). A fine-tuning run's checkpoints all come
after warm-up, so MWA here merges the last ``mwa_last`` checkpoints (one per eval step: the
second half of training); merging every checkpoint of a from-scratch run would let any loss
weighting beat the uniform average by down-weighting the early ones (kept as exploratory
columns). The loss of a checkpoint is the mean training loss of the steps since the previous one
(what a run logs); f = loss^-p or step^p (``rlpost.averaging.weights``; p = 0 is the uniform
average). Claims (pre-declared metric: the final excess loss; pre-declared penalty
``cfg.mwa_p``; paired, all from the same runs; family Choi & Yu 2025): loss-weighted MWA below
the uniform average of the same checkpoints at every setting (constant and cosine), and below the
last checkpoint at the highest constant LR and at every cosine LR.
"""

from __future__ import annotations

from experiments import harness
from experiments.averaging import report as R

CHOI = "Choi & Yu 2025"


def compute(data: dict, cfg, claims: R.Claims) -> dict:
  ev, acc, mwa, mwa_acc = data["evals"], data["evals_acc"], data["mwa"], data["mwa_acc"]
  main, uniform = f"last_loss_p{cfg.mwa_p:g}", "last_loss_p0"
  if main not in mwa:
    raise ValueError(f"averaging T4: the claims' penalty mwa_p={cfg.mwa_p:g} is not among "
                     f"mwa_penalties {list(cfg.mwa_penalties)}")
  explore = [k for k in mwa if k.startswith("last_") and k not in (main, uniform)]
  explore += [k for k in ("loss_p0", f"loss_p{cfg.mwa_p:g}") if k in mwa]
  rows = []
  for sched, lr in R.settings(data):
    idx = R.run_index(data, sched, lr)
    cells = {"last": harness.cell(ev[idx, -1, 0]), "uniform": harness.cell(mwa[uniform][idx]),
             "mwa": harness.cell(mwa[main][idx])}
    accs = {"last": harness.cell(acc[idx, -1, 0]), "uniform": harness.cell(mwa_acc[uniform][idx]),
            "mwa": harness.cell(mwa_acc[main][idx])}
    rows.append({"schedule": sched, "lr": lr, "cells": cells, "accuracy": accs,
                 "explore": {k: harness.cell(mwa[k][idx]) for k in explore},
                 "vs_uniform": R.gain(mwa[uniform][idx], mwa[main][idx]),
                 "vs_last": R.gain(ev[idx, -1, 0], mwa[main][idx])})
  label = f"MWA loss p={cfg.mwa_p:g}, last {cfg.mwa_last}"
  for sched, lr in R.settings(data):
    idx, tag = R.run_index(data, sched, lr), R.lr_label(sched, lr)
    claims.add(f"mwa_beats_uniform_{sched}_lr{lr:g}",
               f"{CHOI}: loss-weighted MWA beats the uniform average of the same checkpoints "
               f"(last {cfg.mwa_last}; LR {tag})",
               {f"{label}, LR {tag}": mwa[main][idx],
                f"uniform last {cfg.mwa_last}, LR {tag}": mwa[uniform][idx]},
               direction="less", family=CHOI)
  hi = max(lr for sched, lr in R.settings(data) if sched == "constant")
  for sched, lr in R.settings(data):
    if sched == "constant" and lr != hi:
      continue
    idx, tag = R.run_index(data, sched, lr), R.lr_label(sched, lr)
    claims.add(f"mwa_beats_last_{sched}_lr{lr:g}",
               f"{CHOI}: loss-weighted MWA surpasses the final checkpoint (LR {tag})",
               {f"{label}, LR {tag}": mwa[main][idx],
                f"last checkpoint, LR {tag}": ev[idx, -1, 0]}, direction="less", family=CHOI)
  return {"rows": rows, "p": cfg.mwa_p, "last": cfg.mwa_last,
          "weights_run0": data.get("mwa_weights_run0")}


def _label(key: str) -> str:
  scope = "last" if key.startswith("last_") else "all"
  kind, p = key.removeprefix("last_").split("_p")
  return f"{kind} p={p} ({scope})"


def markdown(res: dict) -> str:
  first = res["rows"][0]
  head = (["LR", "last checkpoint", f"uniform (last {res['last']})",
           f"MWA loss p={res['p']:g} (last {res['last']})", "uniform - MWA", "last - MWA",
           "accuracy: last", "accuracy: uniform", "accuracy: MWA"])
  rows = [[R.lr_label(r["schedule"], r["lr"])]
          + [harness.fmt(r["cells"][k]) for k in ("last", "uniform", "mwa")]
          + [harness.fmt(r["vs_uniform"]), harness.fmt(r["vs_last"])]
          + [harness.fmt(r["accuracy"][k], 4) for k in ("last", "uniform", "mwa")]
          for r in res["rows"]]
  ex = list(first["explore"])
  rows2 = [[R.lr_label(r["schedule"], r["lr"])] + [harness.fmt(r["explore"][k]) for k in ex]
           for r in res["rows"]]
  return (f"## T4. MWA over the last {res['last']} checkpoints: final excess loss (nats; mean "
          "[95% t interval]; differences: paired by seed) and expected next-token accuracy\n\n"
          + R.markdown_table(head, rows)
          + "\n\nExploratory (no verdicts): other penalties over the last checkpoints, and "
          "merges of every checkpoint of the run, excess loss:\n\n"
          + R.markdown_table(["LR"] + [_label(k) for k in ex], rows2))
