"""T1: gain of LAWA over the raw checkpoint against the learning rate, at 25/50/100% of training.

Papers: Kaddour 2022 (LAWA, k latest checkpoints, uniform mean); Sanyal et al. 2023 ("models
trained with high learning rates observe higher gains due to checkpoint averaging").
Gain = excess loss of the raw checkpoint minus that of LAWA (k, nu = the main spacing), per seed;
mean and 95% bootstrap CI over seeds. Numbers: ``results/averaging/results.json`` ("t1").
"""

from __future__ import annotations

from experiments.averaging import report as R

FRACTIONS = (0.25, 0.5, 1.0)


def compute(data: dict, cfg) -> dict:
  ev = data["evals"]
  m = R.method_index(data, f"lawa_nu{cfg.lawa_main_nu}")
  rows = []
  for sched, lr in R.settings(data):
    idx = R.run_index(data, sched, lr)
    gains = {}
    for f in FRACTIONS:
      j = R.step_index(data, f)
      gains[f"{int(f * 100)}%"] = R.diff_ci(ev[idx, j, 0], ev[idx, j, m])
    rows.append({"schedule": sched, "lr": lr, "raw_final": R.ci(ev[idx, -1, 0]),
                 "lawa_final": R.ci(ev[idx, -1, m]), "gain": gains})
  const = [r for r in rows if r["schedule"] == "constant"]
  lo_lr, hi_lr = const[0], const[-1]
  i_lo = R.run_index(data, "constant", lo_lr["lr"])
  i_hi = R.run_index(data, "constant", hi_lr["lr"])
  g_hi = ev[i_hi, -1, 0] - ev[i_hi, -1, m]
  g_lo = ev[i_lo, -1, 0] - ev[i_lo, -1, m]
  claim_lr = R.diff_ci(g_hi, g_lo)
  all_positive = [R.diff_ci(ev[R.run_index(data, "constant", r["lr"]), -1, 0],
                            ev[R.run_index(data, "constant", r["lr"]), -1, m]) for r in const]
  worst = min(all_positive, key=lambda c: c["lo"])
  return {"k": cfg.lawa_k, "nu": cfg.lawa_main_nu, "rows": rows,
          "claims": [
              {"id": "lawa_beats_raw", "paper": "Kaddour 2022: the average of the k latest "
               "checkpoints is ahead of the raw run (loss and accuracy)",
               "where": "final step, every constant LR (weakest setting shown)", "effect": worst},
              {"id": "gain_grows_with_lr", "paper": "Sanyal et al. 2023: higher learning rates "
               "give higher averaging gains",
               "where": f"final gain at LR {hi_lr['lr']:g} minus at LR {lo_lr['lr']:g}",
               "effect": claim_lr}]}


def markdown(res: dict) -> str:
  head = ["LR", "raw excess (final)", "LAWA excess (final)"] + [f"gain @ {k}" for k in
                                                                 res["rows"][0]["gain"]]
  rows = [[R.lr_label(r["schedule"], r["lr"]), R.fmt(r["raw_final"]), R.fmt(r["lawa_final"])]
          + [R.fmt(R.signed(g)) for g in r["gain"].values()] for r in res["rows"]]
  return (f"### T1. LAWA (k={res['k']}, nu={res['nu']}) gain over the raw checkpoint vs LR\n\n"
          "Excess loss in nats above the entropy floor (lower is better); gain = raw - LAWA "
          "(positive: LAWA better); mean [95% bootstrap CI] over seeds.\n\n"
          + R.markdown_table(head, rows))
