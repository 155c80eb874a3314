"""The testbed calibration (issue 16, step 1): ``--quick`` runs end to end and writes the
results.json and table.md structure (not the numbers)."""

import json

from experiments import calibrate


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
