"""The replication designs of the round-trip and averaging tables: the committed design at
fresh seeds, on the same pinned datasets, with the table's seeds untouched by default."""

import numpy as np

from experiments import averaging, harness, roundtrip, testbeds
from experiments.averaging import sweep
from experiments.roundtrip import config as rt_config
from experiments.roundtrip import inverse


def test_roundtrip_replication_runs_every_kind_at_fresh_seeds_on_the_pinned_data():
  committed = rt_config.get_config(False)
  config = roundtrip.EXPERIMENT.replicate(committed, 4, 1000)
  units = roundtrip.units(config)
  kdv = [u.spec for u in units.values() if u.spec["system"] == "kdv1d"]
  ks = [u.spec for u in units.values() if u.spec["system"] == "ks1d"]
  kinds = set(rt_config.ExperimentConfig.from_dict(committed).plan("kdv1d").kinds())
  assert {s["seed"] for s in kdv} == {1000, 1001, 1002, 1003} and {s["kind"] for s in kdv} == kinds
  assert {s["seed"] for s in ks} == {1000, 1001, 1002}  # ks1d stays capped at 3 seeds
  assert harness.testbeds_in([u.spec for u in units.values()]) == harness.testbeds_in(
      [u.spec for u in roundtrip.units(committed).values()]) == sorted(
          testbeds.PINNED[n] for n in ("kdv1d-data0", "ks1d-data0"))
  assert min(u.spec["seed"] for u in roundtrip.units(committed).values()) == 0


def test_inverse_replication_runs_fresh_seeds_on_the_pinned_data():
  committed = inverse.get_config(False)
  units = inverse.units(inverse.EXPERIMENT.replicate(committed, 3, 500))
  assert sorted(units) == ["s500", "s501", "s502"]
  assert {u.spec["testbed"] for u in units.values()} == {testbeds.dataset_file("kdv1d", 0)}
  assert sorted(inverse.units(committed))[0] == "s0"


def test_averaging_replication_runs_every_setting_at_fresh_seeds_without_a_testbed():
  committed = averaging.get_config(False)
  config = averaging.EXPERIMENT.replicate(committed, 4, 1000)
  runs = averaging.sweep_config(config).runs()
  assert {r["seed"] for r in runs} == {1000, 1001, 1002, 1003}
  settings = {(r["schedule"], r["lr"]) for r in runs}
  assert settings == {(r["schedule"], r["lr"]) for r in sweep.SweepConfig().runs()}
  assert not averaging.EXPERIMENT.pinned
  assert {r["seed"] for r in averaging.sweep_config(committed).runs()} == set(range(8))


def test_collect_reads_the_units_of_the_runs_own_seeds(monkeypatch):
  """collect keys units by the run's seeds (from seed_offset), in order, for the round trip
  (the scatter from the first of them) and the inverse table."""
  from experiments.roundtrip import analysis

  config = roundtrip.EXPERIMENT.replicate(rt_config.get_config(True), 2, 1000)
  cfg = rt_config.ExperimentConfig.from_dict(config)
  win = {"test_traj": 1, "starts": 1, "test": 1, "train": 1, "ood": 1}
  results = {f"{p.name}-{kind}-s{seed}": {"windows": win, "num_params": 1, "kind": kind,
                                          "tag": np.asarray(seed)}
             for p in cfg.plans for seed in cfg.seed_ids(p) for kind in p.kinds()}
  monkeypatch.setattr(analysis, "seed_metrics",
                      lambda got, *a, **k: {"seed": int(got["bidir"]["tag"])})
  monkeypatch.setattr(analysis, "scatter", lambda r, depths: {"from_seed": int(r["tag"])})
  out = roundtrip.collect(config, results)["systems"]
  for plan in cfg.plans:
    assert [m["seed"] for m in out[plan.name]["per_seed"]] == [1000, 1001]
    assert out[plan.name]["scatter"] == {"from_seed": 1000, "seed": 0}  # per_seed index 0
  inv = inverse.EXPERIMENT.replicate(inverse.get_config(True), 2, 7)
  got = inverse.collect(inv, {"s7": {"seed": 7}, "s8": {"seed": 8}})
  assert [s["seed"] for s in got["per_seed"]] == [7, 8]


def _seeds_and_starts(units):
  arms = {k: u.spec for k, u in units.items() if "seeds" in u.spec}
  return arms, {s for spec in arms.values() for s in spec["seeds"]}


def test_dars_replication_runs_every_arm_at_fresh_seeds_from_the_pin():
  from experiments import dars

  committed = dars.get_config(False)
  arms, seeds = _seeds_and_starts(dars.units(dars.EXPERIMENT.replicate(committed, 3, 1000)))
  committed_arms, committed_seeds = _seeds_and_starts(dars.units(committed))
  assert set(arms) == set(committed_arms) and seeds == {1000, 1001, 1002}
  assert committed_seeds == set(range(committed["seeds"]))
  assert harness.testbeds_in(list(arms.values())) == [testbeds.PINNED["b23-sft"]]


def test_mc_grpo_replication_runs_the_primary_table_at_fresh_seeds_from_the_pin():
  from experiments import mc_grpo

  committed = mc_grpo.get_config(False)
  arms, seeds = _seeds_and_starts(mc_grpo.units(mc_grpo.EXPERIMENT.replicate(committed, 3, 1000)))
  committed_arms, _ = _seeds_and_starts(mc_grpo.units(committed))
  # The exploratory 0/1-reward and other-base arms are left out; the primary arms all run.
  assert set(arms) == set(mc_grpo.arm_names(mc_grpo.Design.of(committed)))
  assert set(arms) < set(committed_arms) and seeds == {1000, 1001, 1002}
  assert harness.testbeds_in(list(arms.values())) == [testbeds.PINNED["b23-sft"]]
