"""The round-trip experiment runs end to end at toy size (``reproduce.py roundtrip --quick``),
writes its files, and resumes from its cache without recomputing a unit."""

import json
import os

import numpy as np
import pytest

from experiments import roundtrip as exp
from experiments.roundtrip import claims as CL
from experiments.roundtrip import config as cfg_lib
from experiments.roundtrip import unit as U
from scripts import reproduce

VERDICTS = {CL.REPRODUCED, CL.NOT, CL.INCONCLUSIVE}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("roundtrip")
  with open(exp.README) as f:
    readme = f.read()
  reproduce.main(["roundtrip", "--quick", "--out", str(out), "--no-progress"])
  with open(exp.README) as f:
    assert f.read() == readme  # a quick run never rewrites the README's results
  return out


def test_quick_run_writes_files_and_table(quick_run):
  out = quick_run
  for name in ("table.md", "results.json", "scatter.png", "risk_coverage.png", "calibration.png",
               "directions.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  assert res["meta"]["mode"] == "quick"
  assert res["meta"]["command"] == "python scripts/reproduce.py roundtrip --quick"
  assert set(res["systems"]) == {"kdv1d", "ks1d", "ns2d"}
  assert {s["role"] for s in res["systems"].values()} == {"fair", "stress"}
  assert res["systems"]["ks1d"]["role"] == "stress"
  ids = [c["id"] for c in res["claims"]]
  assert len(ids) == len(CL.CLAIMS) and len(set(ids)) == len(ids)
  for c in res["claims"]:
    assert c["verdict"] in VERDICTS
    assert all(cell["verdict"] in VERDICTS for cell in c["systems"].values())
  # Specialists and the undertrained model run on kdv1d only (quick and full plans).
  spec = next(c for c in res["claims"] if c["id"] == "specialists")
  assert set(spec["systems"]) == {"kdv1d"}
  kdv = res["systems"]["kdv1d"]
  assert {m["kind"] for m in kdv["units"]} == {"bidir", "forward", "backward", "under"}
  assert len(kdv["per_seed"]) == res["meta"]["seeds"] == 2
  k = len(kdv["depths"])
  s = kdv["summary"]
  assert len(s["ranking"]["rho_fixed"]) == k and len(s["ood"]["C"]) == k
  assert set(s["ranking"]["rho_fixed"][0]) == {"mean", "lo", "hi", "n"}
  assert len(s["calibration"]["c_logdepth"]["cov68_by_depth"]) == k
  table = (out / "table.md").read_text()
  assert "### Claims of the paper" in table and "### Weaker forms and controls" in table
  assert "Fair tests: kdv1d, ns2d" in table and "Stress test: ks1d" in table
  claim_rows = [line for line in table.splitlines() if line.startswith("| `")]
  assert len(claim_rows) == len(CL.CLAIMS)
  for line in claim_rows:  # claim, paper, overall verdict, then one cell per system
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == 6, line
    assert cells[2].strip("*") in VERDICTS
  for name in ("kdv1d", "ns2d", "ks1d"):
    assert f"### {name} (" in table


def test_resume_uses_the_cache(quick_run):
  out = quick_run
  before = json.loads((out / "results.json").read_text())
  res = exp.run(type("Args", (), dict(quick=True, seeds=None, out=str(out), no_progress=True))())
  assert res["meta"]["num_cached"] == res["meta"]["num_units"]
  after = json.loads((out / "results.json").read_text())
  assert after["claims"] == before["claims"]
  assert after["systems"]["kdv1d"]["summary"] == before["systems"]["kdv1d"]["summary"]


def test_stale_cache_entry_is_recomputed(tmp_path):
  """A cached unit made with another plan is ignored (its fingerprint differs)."""
  plan = cfg_lib.quick_config().plan("kdv1d")
  arrays, meta = {"test_E": np.ones((2, 3))}, {"fingerprint": plan.fingerprint("bidir")}
  U.save_cached(str(tmp_path), plan, "bidir", 0, arrays, meta)
  hit = U.load_cached(str(tmp_path), plan, "bidir", 0)
  np.testing.assert_array_equal(hit[0]["test_E"], arrays["test_E"])
  other = plan.__class__(**{**plan.__dict__, "sampler_steps": plan.sampler_steps + 1})
  assert U.load_cached(str(tmp_path), other, "bidir", 0) is None


def test_windows_and_start_times():
  traj = np.arange(2 * 10, dtype=np.float32).reshape(2, 10, 1, 1)
  starts = U.start_times(10, 4, 2)
  np.testing.assert_array_equal(starts, [0, 2, 4])
  win = U.windows(traj, starts, 4)
  assert win.shape == (6, 5, 1, 1)
  np.testing.assert_array_equal(win[4, :, 0, 0], traj[1, 2:7, 0, 0])  # trajectory-major
  cyc = U.cycled_windows(traj, starts, 4)
  np.testing.assert_array_equal(cyc[1, :, 0, 0], traj[1, 2:7, 0, 0])
  per = U.persistence_errors(win, spatial_dims=1)
  assert per.shape == (6, 4) and np.all(per > 0)
  with pytest.raises(ValueError):
    U.start_times(4, 4, 1)


def test_verdict_rules():
  def ci(mean, lo, hi, n=3):
    return {"mean": mean, "lo": lo, "hi": hi, "n": n}

  assert CL.above(ci(0.9, 0.85, 0.95), 0.8) == CL.REPRODUCED
  assert CL.above(ci(0.5, 0.4, 0.6), 0.8) == CL.NOT
  assert CL.above(ci(0.8, 0.7, 0.9), 0.8) == CL.INCONCLUSIVE
  assert CL.above(ci(0.9, float("nan"), float("nan"), n=1), 0.8) == CL.INCONCLUSIVE
  assert CL.below(ci(1.1, 1.05, 1.15), 1.2) == CL.REPRODUCED
  assert CL.below(ci(1.4, 1.3, 1.5), 1.2) == CL.NOT
  assert CL.band(ci(0.68, 0.65, 0.7), 0.6, 0.76) == CL.REPRODUCED
  assert CL.band(ci(0.9, 0.85, 0.95), 0.6, 0.76) == CL.NOT
  assert CL.band(ci(0.74, 0.7, 0.8), 0.6, 0.76) == CL.INCONCLUSIVE
  assert CL.every([CL.REPRODUCED, CL.REPRODUCED]) == CL.REPRODUCED
  assert CL.every([CL.REPRODUCED, CL.INCONCLUSIVE]) == CL.INCONCLUSIVE
  assert CL.every([CL.INCONCLUSIVE, CL.NOT]) == CL.NOT
  assert CL.overall([CL.NOT, CL.NOT]) == CL.NOT
  assert CL.overall([CL.REPRODUCED, CL.NOT]) == CL.INCONCLUSIVE
