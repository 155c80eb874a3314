"""T1: gain of LAWA over the raw checkpoint against the learning rate, at 25/50/100% of training.

Papers: Kaddour 2022 (LAWA, k latest checkpoints, uniform mean); Sanyal et al. 2023 ("models
trained with high learning rates observe higher gains due to checkpoint averaging").
Gain = excess loss of the raw checkpoint minus that of LAWA (k, nu = the main spacing), per seed;
mean [95% t interval of the paired per-seed gains]. Claims (pre-declared metric: the final excess
loss): LAWA below raw at every constant LR (paired, one claim per LR, family Kaddour 2022); the
final gain at the highest constant LR above that at the lowest (Welch, family Sanyal et al. 2023).
Kaddour's accuracy half (metric: the final expected next-token accuracy): LAWA above raw at every
constant LR (paired, family Kaddour 2022).
"""

from __future__ import annotations

from experiments import harness
from experiments.averaging import report as R

FRACTIONS = (0.25, 0.5, 1.0)
KADDOUR, SANYAL = "Kaddour 2022", "Sanyal et al. 2023"
ACCURACY = "final expected next-token accuracy"


def compute(data: dict, cfg, claims: R.Claims) -> dict:
  ev, acc = data["evals"], data["evals_acc"]
  m = R.method_index(data, f"lawa_nu{cfg.lawa_main_nu}")
  rows = []
  for sched, lr in R.settings(data):
    idx = R.run_index(data, sched, lr)
    gains = {f"{int(f * 100)}%": R.gain(ev[idx, R.step_index(data, f), 0],
                                        ev[idx, R.step_index(data, f), m]) for f in FRACTIONS}
    rows.append({"schedule": sched, "lr": lr, "raw_final": harness.cell(ev[idx, -1, 0]),
                 "lawa_final": harness.cell(ev[idx, -1, m]), "gain": gains,
                 "raw_acc": harness.cell(acc[idx, -1, 0]),
                 "lawa_acc": harness.cell(acc[idx, -1, m]),
                 "acc_gain": R.gain(acc[idx, -1, m], acc[idx, -1, 0])})
  const = [lr for sched, lr in R.settings(data) if sched == "constant"]
  lawa = f"LAWA k={cfg.lawa_k} nu={cfg.lawa_main_nu}"
  for kind, vals, what, direction, metric in (
      ("", ev, "a lower loss", "less", R.METRIC),
      ("_accuracy", acc, "a higher next-token accuracy", "greater", ACCURACY)):
    for lr in const:
      idx = R.run_index(data, "constant", lr)
      claims.add(f"lawa_beats_raw{kind}_lr{lr:g}",
                 f"{KADDOUR}: the average of the k latest checkpoints has {what} than the raw "
                 f"run (constant LR {lr:g})",
                 {f"{lawa}, LR {lr:g}": vals[idx, -1, m], f"raw, LR {lr:g}": vals[idx, -1, 0]},
                 direction=direction, family=KADDOUR, metric=metric)
  lo_lr, hi_lr = const[0], const[-1]
  i_lo, i_hi = R.run_index(data, "constant", lo_lr), R.run_index(data, "constant", hi_lr)
  claims.add("gain_grows_with_lr",
             f"{SANYAL}: higher learning rates give higher averaging gains (final LAWA gain, "
             f"LR {hi_lr:g} vs {lo_lr:g})",
             {f"gain at LR {hi_lr:g}": ev[i_hi, -1, 0] - ev[i_hi, -1, m],
              f"gain at LR {lo_lr:g}": ev[i_lo, -1, 0] - ev[i_lo, -1, m]},
             direction="greater", family=SANYAL, metric="final LAWA gain, raw - LAWA (nats)",
             paired=False)
  return {"k": cfg.lawa_k, "nu": cfg.lawa_main_nu, "rows": rows}


def markdown(res: dict) -> str:
  head = (["LR", "raw excess (final)", "LAWA excess (final)"]
          + [f"gain @ {k}" for k in res["rows"][0]["gain"]]
          + ["raw accuracy (final)", "LAWA accuracy (final)", "LAWA - raw accuracy"])
  rows = [[R.lr_label(r["schedule"], r["lr"]), harness.fmt(r["raw_final"]),
           harness.fmt(r["lawa_final"])] + [harness.fmt(g) for g in r["gain"].values()]
          + [harness.fmt(r["raw_acc"], 4), harness.fmt(r["lawa_acc"], 4),
             harness.fmt(r["acc_gain"], 4)]
          for r in res["rows"]]
  return (f"## T1. LAWA (k={res['k']}, nu={res['nu']}) gain over the raw checkpoint vs LR\n\n"
          "Excess loss in nats above the entropy floor (lower is better); gain = raw - LAWA "
          "(positive: LAWA better); accuracy: expected next-token accuracy; mean [95% t "
          "interval over seeds; gains and differences: paired by seed].\n\n"
          + R.markdown_table(head, rows))
