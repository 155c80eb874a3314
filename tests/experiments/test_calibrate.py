"""The testbed calibration (issue 16, step 1): ``--quick`` runs end to end on the harness and
writes the results.json and table.md structure (not the numbers); the committed results re-judge
to the committed table."""

import copy
import json
import os
import shutil

import pytest

from experiments import calibrate, harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_arms_and_units_share_identical_specs():
  config = calibrate.get_config(quick=True)
  rows = calibrate.arms(config)
  assert set(rows) == {"pilot/quick-kl0/G4", "pilot/quick-kl0/G2", "final/quick-kl0/G4",
                       "final/quick-kl0/G2"}
  assert len(calibrate.units(config)) == 2  # the final arms are the pilot's (same seeds)
  full = calibrate.get_config(quick=False)
  assert full["seeds"] >= 8 and full["window"] == 3 and full["target_gain"] == 0.10
  for name in full["pilot"]:
    assert calibrate.arm_config(full, name, 2)["group_size"] == 2


def test_calibrate_quick(tmp_path):
  out = tmp_path / "calibration"
  report = calibrate.main(["--quick", "--out", str(out), "--no-progress"])
  res = json.loads((out / "results.json").read_text())
  assert res["command"] == "python experiments/calibrate.py --quick --out " + str(out) + \
      " --no-progress"
  assert {"processor", "cpus", "versions"} <= set(res["machine"])
  config = res["config"]
  rows = res["summary"]["rows"]
  assert set(rows) == set(calibrate.arms(config))
  for row in rows.values():
    n = len(row["seeds"])
    assert n == 2 and len(row["primary"]) == n
    assert {"mean", "lo", "hi", "n"} <= set(row["gain"])
    assert 0.0 <= row["sft"] <= 1.0 and row["seconds"] > 0
    assert row["eval_steps"] == list(range(config["base"]["steps"] + 1))
  for arm in res["data"].values():  # every per-seed evaluation point is kept
    assert all(len(e["per_seed"]) == len(arm["seeds"]) for e in arm["evals"])
  assert set(res["summary"]["g_diff"]) == {"pilot/quick-kl0", "final/quick-kl0"}
  assert set(res["summary"]["target"]) == {"setting", "G4_gain_mean_at_least_target",
                                           "G4_gain_interval_above_target",
                                           "G2_gain_interval_above_0"}
  table = (out / "table.md").read_text()
  assert table.startswith("# GRPO testbed calibration")
  assert "| final | quick-kl0 | 4 | 2 |" in table
  assert report["summary"] == res["summary"]
  # a rerun trains nothing (every arm comes from the cache)
  again = calibrate.main(["--quick", "--out", str(out), "--no-progress"])
  assert again["units_run"] == []
  assert set(again["units"]) == set(calibrate.units(config))  # provenance of every arm
  table = (out / "table.md").read_text()
  calibrate.main(["--rejudge", "--out", str(out)])
  assert (out / "table.md").read_text() == table


def test_committed_results_rejudge_to_the_committed_table(tmp_path):
  src = os.path.join(ROOT, "results", "calibration")
  out = tmp_path / "calibration"
  shutil.copytree(src, out, ignore=shutil.ignore_patterns("cache"))
  calibrate.main(["--rejudge", "--out", str(out)])
  with open(os.path.join(src, "table.md")) as f:
    assert (out / "table.md").read_text() == f.read()


def test_the_step0_guard_knows_the_rebuilt_start():
  with open(os.path.join(ROOT, "results", "calibration", "results.json")) as f:
    report = json.load(f)
  # the committed pilot mixes two SFT starts: the generic guard refuses it
  with pytest.raises(harness.MixedStarts):
    harness.check_same_start(report["data"])
  harness.check_starts(calibrate.EXPERIMENT, report)  # each arm against those of its start
  # any other arm from another start is still refused
  bad = copy.deepcopy(report)
  arm = bad["data"]["b23-lr1e-4-kl0/G8/s0x2"]
  arm["evals"][0]["per_seed"][0] = dict(arm["evals"][0]["per_seed"][0], **{"pass@1": 0.1575})
  with pytest.raises(harness.MixedStarts):
    harness.check_starts(calibrate.EXPERIMENT, bad)
