"""``run_units(jobs=N)``: a table's units in N worker processes, each pinned to its own cores;
failures name the unit and never hang; an RL arm run in a worker agrees with the same arm run in
this process within the cross-program tolerance."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jobs_fixture
from experiments import harness
from rl_testutil import assert_moved, learning_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORES = len(harness.usable_cpus())
needs_two = pytest.mark.skipif(CORES < 2, reason="worker processes need 2 usable cores")


def run(config, cache, jobs=2):
  units = jobs_fixture.units(config)
  return harness.run_units(units, str(cache), "jobs", True, jobs=jobs,
                           source=("jobs_fixture", config))


def test_check_jobs_refuses_counts_outside_the_usable_cores():
  harness.check_jobs(1)
  for bad in (0, -1, CORES + 1):
    with pytest.raises(ValueError, match=f"--jobs {bad}: must be between 1 and the {CORES}"):
      harness.check_jobs(bad)
  if CORES > 1:
    with pytest.raises(ValueError, match="needs source"):
      harness.run_units(jobs_fixture.units({"units": {}}), "/nonexistent", "jobs", True, jobs=2)


@needs_two
def test_units_run_in_pinned_workers_and_a_rerun_loads_them(tmp_path):
  # 3 s per unit: the second worker starts (after the first unit's progress) and imports the
  # fixture well before the first worker runs out of units
  config = {"units": {"a": "where", "b": "where", "c": "where"}, "weights": {"c": 5},
            "pause": 3.0}
  before = os.environ.get("GLIBC_TUNABLES")
  results, seconds, ran, prov = run(config, tmp_path)
  assert list(results) == ["a", "b", "c"] and sorted(ran) == ["a", "b", "c"]
  pids = {r["pid"] for r in results.values()}
  assert os.getpid() not in pids and len(pids) == 2  # both workers took units
  for uid, r in results.items():
    assert len(r["cpus"]) == CORES // 2 or len(r["cpus"]) == -(-CORES // 2)
    assert prov[uid]["cpus_usable"] == len(r["cpus"])
    np.testing.assert_array_equal(r["values"], np.arange(3.0))  # the .npz part came back
    assert r["tunables"].endswith(harness.WORKER_MALLOC)  # the workers' malloc settings
  assert os.environ.get("GLIBC_TUNABLES") == before  # and this process's are as they were
  shares = {frozenset(r["cpus"]) for r in results.values()}  # one per worker, disjoint
  assert len(shares) == 2 and not frozenset.intersection(*shares)
  assert frozenset.union(*shares) == frozenset(harness.usable_cpus())
  again = run(config, tmp_path)
  assert again[2] == [] and again[0]["a"]["pid"] == results["a"]["pid"]


@needs_two
def test_a_failing_unit_is_named(tmp_path):
  config = {"units": {"ok": "where", "bad": "fail"}, "pause": 0.1, "weights": {"ok": 2}}
  with pytest.raises(RuntimeError, match="unit bad failed in its worker process") as e:
    run(config, tmp_path)
  assert "the unit's own error" in str(e.value)


@needs_two
def test_a_dead_worker_is_reported_not_waited_for(tmp_path):
  config = {"units": {"x": "die", "y": "where"}, "pause": 0.1, "weights": {"x": 2}}
  with pytest.raises(RuntimeError, match="unit x: its worker process exited with status 3"):
    run(config, tmp_path)


@needs_two
def test_a_unit_whose_key_differs_in_the_worker_is_not_run(tmp_path, monkeypatch):
  """The worker rebuilds the units; one whose spec or code differs from the parent's (files
  changed during the run) is refused before it runs, not cached under another key."""
  config = {"units": {"a": "where"}, "pause": 0.1}
  units = jobs_fixture.units(config)
  monkeypatch.setattr(harness, "unit_key", lambda u: {"spec": "the parent's", "code": "v1"})
  with pytest.raises(RuntimeError, match="unit a: its spec or code differs from the parent"):
    harness.run_units(units, str(tmp_path), "jobs", True, jobs=2,
                      source=("jobs_fixture", config))
  assert not [f for f in os.listdir(tmp_path) if f.endswith(".json")]  # nothing cached


@needs_two
def test_an_rl_arm_in_a_worker_agrees_with_this_process(tmp_path):
  """The same arm (2 seeds, 2 steps) run in a 1-core worker and here. The programs split their
  reductions by thread count, so the contract is test_mc_grpo's cross-program tolerance, on
  steps that moved: each step's reward within one rollout's reward, the gradient norm to 1e-3
  relative, and each evaluation's pass@1 within one sample."""
  dirs = dict(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
  cfg = learning_config(dirs, steps=2, eval_every=2)
  config = {"units": {"arm": "arm"}, "arm": cfg}
  here = harness.run_units(jobs_fixture.units(config), str(tmp_path / "here"), "jobs", True)
  there = run(config, tmp_path / "there", jobs=CORES)
  assert there[3]["arm"]["cpus_usable"] == 1 < here[3]["arm"]["cpus_usable"] == CORES
  a, b = here[0]["arm"], there[0]["arm"]
  rows = cfg["num_prompts"] * cfg["group_size"]
  for step in range(2):
    assert_moved({k: np.asarray(v[step]) for k, v in a["train"].items()}, f"step {step + 1}")
    for s in range(2):
      assert abs(a["train"]["reward"][step][s] - b["train"]["reward"][step][s]) <= 1 / rows
      np.testing.assert_allclose(b["train"]["grad_norm"][step][s],
                                 a["train"]["grad_norm"][step][s], rtol=1e-3)
  samples = cfg["eval_problems"] * cfg["eval_samples"]
  for ea, eb in zip(a["evals"], b["evals"]):
    for sa, sb in zip(ea["per_seed"], eb["per_seed"]):
      assert abs(sa["pass@1"] - sb["pass@1"]) <= 1 / samples + 1e-9


def test_reproduce_refuses_bad_jobs_in_one_line():
  for args, msg in ((["--jobs", "0"], "--jobs 0: must be between 1"),
                    (["--jobs", str(CORES + 1)], f"--jobs {CORES + 1}: must be between 1"),
                    (["--jobs", "2", "--rejudge"], "--rejudge trains none"),
                    (["--jobs", "2", "--recheck", "grpo"], "--recheck retrains the committed")):
    if "--jobs" in args and args[1] == "2" and len(args) > 2 and CORES < 2:
      continue  # --jobs 2 is refused first, for the cores
    p = subprocess.run([sys.executable, "scripts/reproduce.py", "ace", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and msg in p.stderr, (args, p.stderr[-500:])


@needs_two
@pytest.mark.slow
def test_reproduce_ace_quick_with_two_jobs(tmp_path):
  """The real path: ``reproduce.py ace --quick --jobs 2`` rebuilds the table's units from
  ``experiments.ace`` in two 1-core workers (the first alone until its first step), caches both
  arms and writes the table; its header says how it ran, and a rerun trains nothing."""
  from scripts import reproduce

  out = tmp_path / "ace"
  reproduce.main(["ace", "--quick", "--jobs", "2", "--out", str(out), "--no-progress"])
  res = json.loads((out / "results.json").read_text())
  assert res["command"] == "python scripts/reproduce.py ace --quick --jobs 2"
  assert res["jobs"] == 2 and sorted(res["units_run"]) == sorted(res["data"])
  for uid, prov in res["units"].items():
    assert prov["cpus_usable"] == len(harness.usable_cpus()) // 2, uid
  for arm in res["data"].values():
    assert arm["compilations"] == 1 and len(arm["train"]["reward"]) == res["config"]["steps"]
  assert "with 2 worker processes, each on its own share of the cores" in (
      out / "table.md").read_text()
  reproduce.main(["ace", "--quick", "--jobs", "2", "--out", str(out), "--no-progress"])
  assert json.loads((out / "results.json").read_text())["units_run"] == []
