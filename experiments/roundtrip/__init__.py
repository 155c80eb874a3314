"""Round-trip consistency: bidirectional diffusion rollouts predict their own errors (CPU scale).

Paper: "Round-Trip Consistency: Bidirectional Diffusion Models Can Predict Their Own Rollout
Errors" (arXiv 2608.00675; definitions as read from its abstract, the
round-trip spec as mirrored in ``README.md``).

Command:  python scripts/reproduce.py roundtrip [--quick] [--seeds N] [--out DIR]
          python scripts/reproduce.py roundtrip --rejudge   # re-judge results/roundtrip (seconds)
Hardware: CPU (2 cores). For each system of the plan (kdv1d: the fair test, 10 seeds from power;
ks1d: the stress test, 3 seeds; ns2d, a fair system whose model never learned at this budget, is
in the quick run only) and seed, one bidirectional flow-matching stepper is trained (``rlpost.dynamics.train``), rolled out
from held-out test starts, training starts and OOD starts, and round-tripped
(``rlpost.dynamics.rollout.round_trip``); on kdv1d, forward-only and backward-only specialists and
an undertrained model are trained beside it. Plans: ``config.py``; one unit: ``unit.py``;
per-seed statistics: ``analysis.py``; claims as data: ``claims.py``; tables and plots:
``report.py``. The experiment is ``EXPERIMENT`` on ``experiments/harness.py``: one cached unit per
(system, model kind, seed), whose per-seed statistics ``collect`` keeps in ``results.json`` (with
the first seed's scatter of C_i against E_i), so that ``--rejudge`` and the plots need only that
file.

Claims: one-sample claims about pre-declared per-seed summaries (a rule made "at every depth" is
judged on the seed's worst depth, a "depth mean" rule on the seed's mean over depths; one test
per part, not one per depth), judged by Student-t intervals and one-sided t tests (TOST for the
coverage bands), Holm-adjusted within the paper's family on the deciding systems; weaker forms and
controls form a second family; see ``claims.py``. ``selective_vs_depth`` (the pooled cut three
times the depth-only one) is dropped: not even an oracle ranking meets it (README, "Verdict
history").

Outputs in ``--out`` (default ``results/roundtrip``): ``table.md``, ``results.json`` (every per-seed
number, the config, the command, machine and runtime), ``scatter.png``, ``risk_coverage.png``,
``calibration.png``, ``directions.png``; finished units are cached under ``<out>/cache/``. A full
run (or a re-judge) into ``results/roundtrip`` also rewrites the generated block at the end of
this docstring and the results section of ``experiments/roundtrip/README.md``.

Results on this CPU (generated from results/roundtrip/table.md; do not edit by hand):

`python scripts/reproduce.py roundtrip`: seeds: kdv1d 10 (10 from power: pilot SD 0.145, minimum effect 0.2, 80% power at alpha 0.05 by the two-sided two-sample formula; floor 8), ks1d 3 (capped: it decides nothing) (model initialisation and training noise; data fixed, dataset seed 0); 93.7 min of training and evaluation over 43 units (AMD EPYC, 2 CPU cores, jax 0.10.2 on cpu). Minimum detectable effect of the paper's parts: 0.0149-0.443 (each part's in its row). Cells: mean [95% Student-t interval over seeds].

## Paper claims

Verdicts on the deciding systems (kdv1d); the other systems' verdicts, in their own families, are shown beside and do not enter the verdict column. A claim of several parts is reproduced when every part is, not reproduced when any part is.

| claim | paper | verdict | kdv1d (fair) | ks1d (stress) |
| --- | --- | --- | --- | --- |
| `fixed_depth` | C_i ranks rollout error at fixed depth: Spearman 0.91-0.98 | **not reproduced** | not reproduced | not reproduced |
| `within_trajectory` | ranking within trajectories: Spearman 0.69 +- 0.16 | **not reproduced** | not reproduced | not reproduced |
| `calibrator_width` | calibrator interval factors 1.14x (68%) / 1.29x (95%) | **not reproduced** | not reproduced | not reproduced |
| `calibrator_coverage` | calibrator coverage near nominal (68% / 95%) | **inconclusive** | inconclusive | inconclusive |
| `calibrator_nll` | calibrator one nat better than depth-only (held-out NLL) | **not reproduced** | not reproduced | not reproduced |
| `ood_auroc` | OOD AUROC 0.98, 1.0 by depth 10 | **not reproduced** | not reproduced | not reproduced |
| `dispersion_inverts` | sampling-dispersion baselines invert on OOD data (AUROC < 0.5) | **not reproduced** | not reproduced | not reproduced |
| `selective_cut` | 15% error cut at 80% coverage | **not testable** | not testable | not testable |
| `specialists` | bidirectional training beats direction specialists in both directions | **not reproduced** | not reproduced | n/a |
| `inverse_solver` | the backward direction works as an inverse solver | **reproduced** | reproduced | not reproduced |

Oracle check not passed (not shown that any ranking can meet the rule there, so the rule may not test C_i; see "Sanity checks"): `selective_cut` (kdv1d, ks1d); `selective_pooled_beats_depth` (ks1d).

Parts on the deciding systems: one Holm family, 10 seeds, one-sample claims about per-seed summaries (a - threshold). Intervals cover seed-to-seed variation (model initialisation and training noise) only: every seed is evaluated on the same fixed test, training and OOD trajectories with the same evaluation noise keys, so they exclude the sampling error of the trajectories.

| claim (paper) | ours: a - b [interval] | SESOI | p (Holm) | permutation p | seeds | min. detectable | declared | verdict |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| `fixed_depth`: Spearman(C_i, E_i) at the seed's worst depth above 0.80 | kdv1d - 0.8: -0.490 [-0.670, -0.309] | 0 | 1 (1) | 1 | 10 | 0.236 | f236b92 | not reproduced |
| `within_trajectory`: depth mean of the within-trajectory mean Spearman above 0.53 (= 0.69 - 0.16) | kdv1d - 0.53: -0.337 [-0.409, -0.266] | 0 | 1 (1) | 1 | 10 | 0.094 | f236b92 | not reproduced |
| `calibrator_width`: 68% factor exp(sigma) below 1.20 | kdv1d - 1.2: +0.219 [+0.142, +0.297] | 0 | 1 (1) | 1 | 10 | 0.101 | f236b92 | not reproduced |
| `calibrator_coverage`: held-out 68% coverage within 0.683 +- 0.08 | kdv1d - 0.683: +0.046 [+0.016, +0.076] | +-0.08 | 0.0327 (0.392) | 0.0273 | 10 | 0.048 | f236b92 | inconclusive; but a - b is significantly above 0 (95% interval [+0.009, +0.083]) |
| `calibrator_coverage`: held-out 95% coverage within 0.95 +- 0.04 | kdv1d - 0.95: -0.017 [-0.035, +0.001] | +-0.04 | 0.0214 (0.279) | 0.102 | 10 | 0.029 | f236b92 | inconclusive |
| `calibrator_nll`: NLL gain over the log-depth-only calibrator above 0.5 nats | kdv1d - 0.5: -0.295 [-0.400, -0.190] | 0 | 1 (1) | 0.999 | 10 | 0.137 | f236b92 | not reproduced |
| `ood_auroc`: depth-mean AUROC of C_i above 0.90 | kdv1d - 0.9: -0.053 [-0.105, -0.002] | 0 | 0.978 (1) | 0.997 | 10 | 0.068 | f236b92 | not reproduced; near its threshold (the deciding bound is 0.002 from it, under half the minimum detectable effect 0.068) |
| `ood_auroc`: AUROC of C_i at the deepest depth above 0.95 | kdv1d - 0.95: -0.295 [-0.378, -0.211] | 0 | 1 (1) | 1 | 10 | 0.109 | f236b92 | not reproduced |
| `dispersion_inverts`: depth-mean AUROC of the raw sample spread below 0.5 | kdv1d - 0.5: +0.045 [+0.034, +0.057] | 0 | 1 (1) | 1 | 10 | 0.015 | f236b92 | not reproduced |
| `dispersion_inverts`: depth-mean AUROC of the normalised sample spread below 0.5 | kdv1d - 0.5: +0.186 [+0.171, +0.202] | 0 | 1 (1) | 1 | 10 | 0.021 | f236b92 | not reproduced |
| `selective_cut`: depth mean of the per-depth error cut ranking by C_i above 0.15 | kdv1d - 0.15: -0.060 [-0.085, -0.035] | 0 | 1 (1) | 1 | 10 | 0.032 | f236b92 | not reproduced |
| `specialists`: forward: log(specialist / bidirectional error), depth mean, above 0 | kdv1d - 0: -0.266 [-0.440, -0.092] | 0 | 0.996 (1) | 0.995 | 10 | 0.228 | f236b92 | not reproduced; near its threshold (the deciding bound is 0.092 from it, under half the minimum detectable effect 0.228) |
| `specialists`: backward: log(specialist / bidirectional error), depth mean, above 0 | kdv1d - 0: -0.088 [-0.426, +0.250] | 0 | 0.716 (1) | 0.709 | 10 | 0.443 | f236b92 | inconclusive |
| `inverse_solver`: log(error of x_0 := x_i / error recovering x_0 from the true x_i) at the worst depth above 0 | kdv1d - 0: +1.898 [+1.582, +2.214] | 0 | 1.33e-07 (1.87e-06) | 0.000977 | 10 | 0.414 | f236b92 | reproduced |

Statistics: TOST (paired t), margin 0.04; TOST (paired t), margin 0.08; paired t interval and one-sided paired t test at 95%, Holm-adjusted within each family; 10 seeds per arm; pooled seed SD up to 0.473; minimum detectable effect (80% power) 0.0149-0.443.

Rules (protocol v2, experiments/STATISTICS.md; `experiments/harness.py`): a directional claim is *reproduced* when its Holm-adjusted one-sided p is <= 0.05 and it is not equivalent to the threshold within +-SESOI (TOST, 90% interval), *trivial* when it is significant but equivalent (too small to matter), *not reproduced* when it is equivalent but not significant or its interval lies wholly on the other side, *inconclusive* otherwise (SESOI 0: the threshold is itself the effect of interest, no *trivial* outcome); an equivalence claim (margin 0.04/0.08) is *reproduced* when TOST rejects (Holm-adjusted), *not reproduced* when its 90% interval lies wholly outside the margin, *inconclusive* otherwise. An equivalence claim whose difference is significantly non-zero (95% interval), whatever its verdict, and a holding no-gain claim whose difference is, say so beside the verdict, and so does a verdict whose deciding bound lies within half a minimum detectable effect of its threshold (near its threshold: it can flip on another start or seed set). The permutation p (not adjusted) is reported beside the deciding test. Min. detectable: the difference a two-sided test at 80% power would find at these seeds and this seed SD. Declared: the commit that declared the claim; exploratory claims were declared after the run that motivated them and are kept out of the headline. Rules made at every depth are judged on each seed's worst depth. A claim is *not testable* on a system where an oracle ranking (by the true error) is not shown to meet its rule (its parts keep their own verdicts; ``experiments/roundtrip/claims.py``). At 10 seeds the permutation p's smallest value is 1/1024.

Dropped: `selective_vs_depth` (the cut is three times the depth-only baseline's; old rule: pooled (C cut - 3 x depth-only cut) above 0, and the C cut above 0): no ranking can meet it: pooled over depths, ranking by depth alone already earns nearly the oracle's whole cut (errors grow by an order of magnitude over the depths), so even the oracle's pooled cut is far below three times the depth-only one (oracle - 3 x depth-only below). Its attainable weaker form, `selective_pooled_beats_depth`, is a control. Intervals over seeds: pooled_cut_C_minus_3x_depth: kdv1d -1.045 [-1.090, -1.001], ks1d -1.183 [-1.371, -0.994]; pooled_cut_oracle_minus_3x_depth: kdv1d -1.010 [-1.052, -0.968], ks1d -1.168 [-1.397, -0.940].

(end of generated results)
"""

from __future__ import annotations

import functools

from experiments import harness
from experiments.roundtrip import analysis as A
from experiments.roundtrip import claims as CL
from experiments.roundtrip import config as cfg_lib
from experiments.roundtrip import report as rep
from experiments.roundtrip import unit as U


@functools.lru_cache(maxsize=4)
def _data(system: str, data_seed: int) -> dict:
  """The system's four splits: the pinned dataset (``experiments/testbeds``) where there is one,
  else integrated here."""
  from experiments import testbeds
  from rlpost.dynamics import data as data_lib

  pinned = testbeds.dataset(system, data_seed)
  return pinned[1] if pinned else data_lib.load_all(system, seed=data_seed)


def units(config: dict) -> dict[str, harness.Unit]:
  """One unit per (system, seed, model kind); its spec is what the unit's result depends on."""
  cfg = cfg_lib.ExperimentConfig.from_dict(config)
  out = {}
  for plan in cfg.plans:
    for seed in cfg.seed_ids(plan):
      for kind in plan.kinds():
        steps = plan.train_config(kind).num_steps

        def run(progress, plan=plan, kind=kind, seed=seed, steps=steps):
          result = U.run_unit(kind, plan, _data(plan.name, cfg.data_seed), seed)
          progress(steps)
          return result

        out[f"{plan.name}-{kind}-s{seed}"] = harness.Unit(
            plan.unit_spec(kind, seed, cfg.data_seed), run, steps)
  return out


def _arrays(result: dict) -> dict:
  return {k: v for k, v in result.items() if hasattr(v, "shape")}


def collect(config: dict, results: dict) -> dict:
  """What results.json keeps: per system, the per-seed statistics (``analysis.seed_metrics``),
  the first seed's scatter (``analysis.scatter``), the units' metadata and descriptions for the
  report."""
  from rlpost.dynamics import systems as systems_lib

  cfg = cfg_lib.ExperimentConfig.from_dict(config)
  systems = {}
  for plan in cfg.plans:
    per_seed, metas = [], []
    for seed in cfg.seed_ids(plan):
      got = {kind: results[f"{plan.name}-{kind}-s{seed}"] for kind in plan.kinds()}
      metas += [{k: v for k, v in r.items() if not hasattr(v, "shape")} for r in got.values()]
      win = got["bidir"]["windows"]
      per_seed.append(A.seed_metrics({k: _arrays(r) for k, r in got.items()}, plan.depths,
                                     num_test_traj=win["test_traj"], num_starts=win["starts"],
                                     ood_every=plan.ood_start_every, coverage=cfg.coverage))
    bidir = results[f"{plan.name}-bidir-s{cfg.seed_offset}"]
    win, model, sys_obj = bidir["windows"], plan.train.model, systems_lib.get_system(plan.name)
    systems[plan.name] = {
        "role": plan.role, "depths": list(plan.depths), "description": sys_obj.description,
        "ood_description": sys_obj.ood_description, "per_seed": per_seed, "units": metas,
        "num_params": bidir["num_params"],
        "model": (f"{'latent' if model.latent else 'field'} diffusion, width {model.width}, "
                  f"{model.num_blocks} blocks"),
        "steps": plan.train.num_steps, "batch_size": plan.train.batch_size,
        "sampler": (f"{plan.sampler_steps} Euler steps from zero noise for E_i and C_i; "
                    f"M = {plan.num_samples} samples from Gaussian noise for the spread"),
        "rollouts": (f"{win['test']} test windows ({win['starts']} start times x "
                     f"{win['test'] // win['starts']} trajectories), {win['train']} training "
                     f"windows (calibrator), {win['ood']} OOD windows"),
        # "seed": the scattered seed's index in per_seed (the run's first seed).
        "scatter": dict(A.scatter(_arrays(bidir), plan.depths), seed=0),
    }
  return {"systems": systems}


def summarize(report: dict) -> dict:
  """Intervals of every per-seed number and the verdicts, from ``report["data"]`` alone."""
  systems = report["data"]["systems"]
  out = CL.judge({n: s["per_seed"] for n, s in systems.items()},
                 {n: s["role"] for n, s in systems.items()})
  out["systems"] = {n: A.summarize([{k: v for k, v in ps.items() if k != "curves"}
                                    for ps in s["per_seed"]])
                    for n, s in systems.items()}
  return out


def replicate(config: dict, seeds: int, seed_offset: int) -> dict:
  """The committed design at fresh model seeds on the same pinned datasets (every system and
  model kind: the claims compare kinds and depths within each seed)."""
  return dict(config, seeds=seeds, seed_offset=seed_offset)


EXPERIMENT = harness.Experiment(
    name="roundtrip", get_config=cfg_lib.get_config, units=units, summarize=summarize,
    render=rep.render, plot=rep.plots, collect=collect, module="experiments.roundtrip",
    replicate=replicate)
