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
run (or a re-judge) into ``results/roundtrip`` also rewrites the results section of
``experiments/roundtrip/README.md`` (``experiments/docsync.py``), which holds the numbers this
table last produced.
"""

from __future__ import annotations

import functools

from experiments import harness
from experiments.roundtrip import analysis
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
      per_seed.append(analysis.seed_metrics(
          {k: _arrays(r) for k, r in got.items()}, plan.depths, num_test_traj=win["test_traj"],
          num_starts=win["starts"], ood_every=plan.ood_start_every, coverage=cfg.coverage))
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
        "scatter": dict(analysis.scatter(_arrays(bidir), plan.depths), seed=0),
    }
  return {"systems": systems}


def summarize(report: dict) -> dict:
  """Intervals of every per-seed number and the verdicts, from ``report["data"]`` alone."""
  systems = report["data"]["systems"]
  out = CL.judge({n: s["per_seed"] for n, s in systems.items()},
                 {n: s["role"] for n, s in systems.items()})
  out["systems"] = {n: analysis.summarize([{k: v for k, v in ps.items() if k != "curves"}
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
