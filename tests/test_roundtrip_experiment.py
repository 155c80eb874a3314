"""The round-trip experiment on ``experiments/harness.py``: a toy-size run end to end
(``reproduce.py roundtrip --quick``), its cache, a re-judge of its output and of the committed
results, and the claims' rules."""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from experiments import docsync, harness
from experiments import roundtrip as exp
from experiments.roundtrip import claims as CL
from experiments.roundtrip import config as cfg_lib
from experiments.roundtrip import unit as U
from scripts import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERDICTS = {CL.REPRODUCED, CL.NOT, CL.INCONCLUSIVE, harness.NOT_TESTABLE}
MODULE, README = docsync.paths(exp.EXPERIMENT)


def _read(path):
  with open(path) as f:
    return f.read()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("roundtrip")
  docs = _read(README), _read(MODULE)
  reproduce.main(["roundtrip", "--quick", "--out", str(out), "--no-progress"])
  assert (_read(README), _read(MODULE)) == docs  # a quick run never rewrites the docs
  return out


def test_quick_run_writes_files_and_table(quick_run):
  out = quick_run
  for name in ("table.md", "results.json", "scatter.png", "risk_coverage.png", "calibration.png",
               "directions.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  assert res["experiment"] == "roundtrip"
  assert res["command"] == "python scripts/reproduce.py roundtrip --quick"
  assert res["config"]["seeds"] == 2 and len(res["units_run"]) == 12
  systems = res["data"]["systems"]
  assert set(systems) == {"kdv1d", "ks1d", "ns2d"}
  assert {n: s["role"] for n, s in systems.items()} == {"kdv1d": "fair", "ns2d": "fair",
                                                        "ks1d": "stress"}
  # Specialists and the undertrained model run on kdv1d only (quick and full plans).
  kdv = systems["kdv1d"]
  assert {m["kind"] for m in kdv["units"]} == {"bidir", "forward", "backward", "under"}
  assert len(kdv["per_seed"]) == 2
  k = len(kdv["depths"])
  assert len(kdv["scatter"]["E"]) == k and len(kdv["scatter"]["pred"][0]) > 0
  s = res["summary"]
  assert len(s["systems"]["kdv1d"]["ranking"]["rho_fixed"]) == k
  assert set(s["systems"]["kdv1d"]["ranking"]["rho_fixed"][0]) == {"mean", "lo", "hi", "n"}
  assert [c["id"] for c in s["claims"]] == [c.id for c in CL.CLAIMS]
  for c in s["claims"]:
    assert c["verdict"] in VERDICTS and set(c["systems"].values()) <= VERDICTS
    if not c["deciding_systems"]:
      assert c["verdict"] == CL.INCONCLUSIVE
  spec = next(c for c in s["claims"] if c["id"] == "specialists")
  assert set(spec["systems"]) == {"kdv1d"}
  assert set(s["deciding"]) <= {"kdv1d", "ns2d"}  # the stress test never decides
  for family, vs in s["verdicts"].items():
    for v in vs:
      assert v["verdict"] in VERDICTS and v["claim"]["family"] == family
      assert v["n"][0] == 2 and len(v["claim"]["arms"]) == 1
  table = (out / "table.md").read_text()
  for heading in ("## Paper claims", "## Weaker forms and controls", "## Sanity checks",
                  "### kdv1d (fair test)", "### ns2d (fair test)", "### ks1d (stress test)"):
    assert heading in table, heading
  assert "Fair tests: kdv1d, ns2d" in table and "Stress test: ks1d" in table
  assert "Student-t" in table and "exclude the sampling error" in table
  assert "Dropped: `selective_vs_depth`" in table
  claim_rows = [line for line in table.splitlines() if line.startswith("| `")
                and line.count("|") == 7]
  assert len(claim_rows) == len(CL.CLAIMS)
  for line in claim_rows:  # claim, paper, overall verdict, then one cell per system
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2].strip("*") in VERDICTS
    assert set(cells[3:]) <= VERDICTS | {"n/a"}, line


def test_resume_uses_the_cache_and_rejudge_reproduces(quick_run, tmp_path):
  out = quick_run
  before = json.loads((out / "results.json").read_text())
  table = (out / "table.md").read_text()
  args = type("Args", (), dict(quick=True, seeds=None, out=str(out), no_progress=True))()
  res = harness.run(exp.EXPERIMENT, args)
  assert res["units_run"] == []  # every unit came from the cache
  assert res["data"] == before["data"] and res["summary"] == before["summary"]
  # A re-judge needs only results.json (no cache, no training) and writes the same table.
  shutil.copy(out / "results.json", tmp_path / "results.json")
  reproduce.main(["roundtrip", "--rejudge", "--out", str(tmp_path)])
  assert (tmp_path / "table.md").read_text() == table
  after = json.loads((tmp_path / "results.json").read_text())
  assert after["summary"] == before["summary"]
  assert {"scatter.png", "calibration.png"} <= set(os.listdir(tmp_path))


def test_committed_results_rejudge_to_the_committed_table(tmp_path):
  """results/roundtrip holds a harness results.json whose re-judge is table.md as committed (so
  the table and the README section follow from the per-seed numbers)."""
  committed = os.path.join(ROOT, "results", "roundtrip")
  shutil.copy(os.path.join(committed, "results.json"), tmp_path / "results.json")
  harness.rejudge(exp.EXPERIMENT, str(tmp_path))
  assert (tmp_path / "table.md").read_text() == _read(os.path.join(committed, "table.md"))
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["config"]["seeds"] == 10 and res["summary"]["deciding"] == ["kdv1d"]
  counts = {n: len(s["per_seed"]) for n, s in res["data"]["systems"].items()}
  assert counts == {"kdv1d": 10, "ks1d": 3}  # the design: kdv1d from power, ks1d capped, no ns2d
  assert docsync.readme_section("roundtrip") in _read(README)


def test_unit_spec_is_the_cache_key(tmp_path):
  """A cached unit is found under its own spec only: changing anything the unit depends on
  (here the sampler) or the seed misses the cache."""
  plan = cfg_lib.quick_config().plan("kdv1d")
  cache = harness.UnitCache(str(tmp_path))
  spec = plan.unit_spec("bidir", 0, 0)
  assert json.loads(json.dumps(spec)) == spec  # plain data
  cache.save("kdv1d-bidir-s0", spec, {"test_E": np.ones((2, 3)), "kind": "bidir"}, 1.5)
  hit, seconds = cache.load("kdv1d-bidir-s0", spec)
  np.testing.assert_array_equal(hit["test_E"], np.ones((2, 3)))
  assert hit["kind"] == "bidir" and seconds == 1.5
  other = dataclasses.replace(plan, sampler_steps=plan.sampler_steps + 1)
  assert cache.load("kdv1d-bidir-s0", other.unit_spec("bidir", 0, 0)) is None
  assert cache.load("kdv1d-bidir-s0", plan.unit_spec("bidir", 1, 0)) is None
  assert plan.unit_spec("under", 0, 0)["train"]["num_steps"] == plan.undertrained_steps


def test_config_round_trips_through_plain_data():
  for quick in (True, False):
    config = cfg_lib.get_config(quick)
    cfg = cfg_lib.ExperimentConfig.from_dict(json.loads(json.dumps(config)))
    assert cfg == (cfg_lib.quick_config() if quick else cfg_lib.full_config())
  units = exp.units(dict(cfg_lib.get_config(False), seeds=2))
  assert len(units) == 2 * (4 + 1) and "kdv1d-under-s1" in units
  # The full run: kdv1d (deciding) at the seeds from power, ks1d (stress) capped at 3, no ns2d.
  full = cfg_lib.full_config()
  assert full.seeds == cfg_lib.seeds_from_power() >= 8
  assert [p.name for p in full.plans] == ["kdv1d", "ks1d"]
  units = exp.units(dict(cfg_lib.get_config(False), seeds=5))
  assert len(units) == 5 * 4 + 3 and "ks1d-bidir-s2" in units and "ks1d-bidir-s3" not in units
  assert full.plan("ks1d").num_seeds(2) == 2 and full.plan("kdv1d").num_seeds(12) == 12


def test_kdv_plan_rolls_out_16_start_times(tmp_path):
  """The full kdv1d plan: 16 start times per test trajectory (frames 0-15), OOD rollouts from
  every fourth; the unit spec carries the system's fingerprint, so new data retrains."""
  from rlpost.dynamics import systems

  plan = cfg_lib.full_config().plan("kdv1d")
  traj = np.zeros((3, 40, 4, 1), np.float32)
  got = U.unit_data(plan, {"train": traj, "test": traj, "ood": traj})
  np.testing.assert_array_equal(got["starts"], np.arange(16))
  np.testing.assert_array_equal(got["ood_starts"], [0, 4, 8, 12])
  assert got["test"].shape == (3 * 16, 17, 4, 1) and got["ood"].shape == (3 * 4, 17, 4, 1)
  spec = plan.unit_spec("bidir", 0, 0)
  assert spec["fingerprint"] == systems.get_system("kdv1d").fingerprint()


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


def _seed(skill, rho, cov68=0.68, auroc=(0.97, 0.96)):
  """A per-seed statistics dict with the entries the claims read."""
  return {"ranking": {"skill": skill, "rho_fixed": list(rho), "rho_within_depth_mean": 0.6},
          "calibration": {"c_logdepth": {"factor68": 1.1, "cov68": cov68, "cov95": 0.95,
                                         "cov68_by_depth": [cov68, cov68]},
                          "nll_gain": 1.0, "nll_gain_vs_onehot": 1.0},
          "ood": {"C": list(auroc), "C_depth_mean": float(np.mean(auroc))}}


def test_rules_judge_worst_depth_gate_and_families():
  rng = np.random.default_rng(0)
  good = [_seed(0.9 + 0.01 * rng.standard_normal(), [0.95, 0.9 + 0.01 * i], 0.68 + 0.005 * i)
          for i in range(4)]
  # The worst depth decides a rule made at every depth: a mean depth above 0.8 is not enough.
  poor = [_seed(0.9 + 0.01 * i, [0.99, 0.5 + 0.01 * i]) for i in range(4)]
  unskilled = [_seed(0.01 * i, [0.99, 0.99 - 0.01 * i]) for i in range(4)]
  out = CL.judge({"a": good, "b": poor, "c": unskilled}, {"a": "fair", "b": "fair", "c": "fair"})
  assert out["deciding"] == ["a", "b"]  # c fails the skill gate
  claims = {c["id"]: c for c in out["claims"]}
  fixed = claims["fixed_depth"]
  assert fixed["systems"] == {"a": CL.REPRODUCED, "b": CL.NOT, "c": CL.REPRODUCED}
  assert fixed["verdict"] == CL.INCONCLUSIVE  # the deciding systems disagree
  assert fixed["deciding_systems"] == ["a", "b"]
  assert "specialists" not in {c["id"] for c in out["claims"] if c["systems"]}
  fam = out["verdicts"]
  assert {v["claim"]["arms"][0] for v in fam["paper"]} == {"a", "b"}
  assert {v["claim"]["arms"][0] for v in fam["paper@c"]} == {"c"}
  # Holm within the paper family: the same data judged alone has a smaller adjusted p.
  alone = CL.judge({"a": good}, {"a": "fair"})["verdicts"]["paper"]
  first = next(v for v in fam["paper"] if v["claim"]["id"] == "fixed_depth.0@a")
  assert first["p_holm"] > next(v for v in alone if v["claim"]["id"] == "fixed_depth.0@a")[
      "p_holm"]
  # Coverage near nominal is an equivalence claim (TOST) on the band.
  cov = next(v for v in fam["paper"] if v["claim"]["id"] == "calibrator_coverage.0@a")
  assert cov["claim"]["direction"] == "equivalent" and cov["claim"]["margin"] == CL.BAND68
  # A stress-test system never decides, whatever its skill.
  assert CL.judge({"a": good}, {"a": "stress"})["deciding"] == []


def test_every_and_overall():
  assert CL.every([CL.REPRODUCED, CL.REPRODUCED]) == CL.REPRODUCED
  assert CL.every([CL.REPRODUCED, CL.INCONCLUSIVE]) == CL.INCONCLUSIVE
  assert CL.every([CL.INCONCLUSIVE, CL.NOT]) == CL.NOT
  assert CL.overall([CL.NOT, CL.NOT]) == CL.NOT
  assert CL.overall([CL.REPRODUCED, CL.NOT]) == CL.INCONCLUSIVE


def test_metrics_reduce_per_seed():
  s = _seed(0.9, [0.9, 0.4, 0.7], cov68=0.6)
  assert CL.METRICS["rho_fixed_worst"](s) == pytest.approx(0.4)
  assert CL.METRICS["auroc_C_deepest"](s) == pytest.approx(0.96)
  assert CL.METRICS["cov68_worst_deviation"](s) == pytest.approx(0.083)
  assert CL.METRICS["gain_fwd"](s) is None  # no specialists: the part is not judged
  vals = CL.per_seed_values([s, dict(s, ranking=dict(s["ranking"], skill=None))])
  assert vals["skill"] == [0.9] and "gain_fwd" not in vals


def test_every_ranking_rule_has_an_oracle_check():
  """Each selective-prediction and OOD rule is also judged with the true error as the score (the
  sanity family), at the claim's own threshold: a rule the oracle fails tests nothing."""
  parts = {c.id: c.parts for c in CL.CLAIMS}
  checked = [cid for cid, _ in CL.ATTAINABLE]
  assert set(checked) == {"selective_cut", "selective_per_depth", "selective_pooled_beats_depth",
                          "ood_auroc"}
  oracle = dict(zip(checked, [p for _, p in CL.ATTAINABLE]))
  assert oracle["selective_cut"].center == parts["selective_cut"][0].center == CL.SELECTIVE_CUT
  assert CL.SELECTIVE_CUT == 0.15  # the paper's cut
  assert ([p.center for cid, p in CL.ATTAINABLE if cid == "ood_auroc"]
          == [p.center for p in parts["ood_auroc"]])
  rng = np.random.default_rng(1)
  seeds = []
  for i in range(6):
    s = _seed(0.9, [0.9, 0.9])
    cut = 0.11 + 0.01 * rng.standard_normal()  # the oracle cuts ~11%: below the paper's 15%
    s["selective"] = {"by_depth": {"oracle": [cut, cut + 0.02]},
                      "pooled": {"oracle": 0.5 + 0.01 * i, "depth": 0.4}}
    s["ood"].update(E=[0.99, 0.995 + 0.001 * i], E_depth_mean=0.99 + 0.001 * i)
    seeds.append(s)
  out = CL.judge({"a": seeds}, {"a": "fair"})
  sanity = {v["claim"]["id"]: v["verdict"] for v in out["verdicts"]["sanity@a"]}
  assert sanity == {"selective_cut.oracle0@a": CL.NOT,
                    "selective_per_depth.oracle1@a": CL.REPRODUCED,
                    "selective_pooled_beats_depth.oracle2@a": CL.REPRODUCED,
                    "ood_auroc.oracle3@a": CL.REPRODUCED, "ood_auroc.oracle4@a": CL.REPRODUCED}


def test_header_with_seeds_from_power_and_a_capped_system(quick_run, tmp_path):
  """The full run's shape: the deciding system at the seeds from power, the stress test capped;
  the header attaches the power note to the former and lists the failed oracle checks."""
  res = json.loads((quick_run / "results.json").read_text())
  systems = res["data"]["systems"]
  kdv = systems["kdv1d"]["per_seed"]
  systems["kdv1d"]["per_seed"] = kdv + [kdv[0]]  # a third kdv1d seed
  res["config"].update(seeds=3, pilot_sd=0.145, min_effect=0.2, min_seeds=3)
  (tmp_path / "results.json").write_text(json.dumps(res))
  harness.rejudge(exp.EXPERIMENT, str(tmp_path))
  table = (tmp_path / "table.md").read_text()
  power = ("(10 from power: pilot SD 0.145, minimum effect 0.2, 80% power at alpha 0.05 by the "
           "two-sided two-sample formula; floor 3)")
  assert f"seeds: kdv1d 3 {power}, ns2d 2 (capped), ks1d 2 (capped: it decides nothing)" in table
  out = json.loads((tmp_path / "results.json").read_text())
  failed = [c for c in out["summary"]["claims"] if c["oracle_fails"]]
  assert all(c["id"] in {"selective_cut", "selective_per_depth", "selective_pooled_beats_depth"}
             for c in failed)
  if failed:
    assert "Oracle check not passed" in table


def test_a_rule_the_oracle_cannot_meet_is_not_testable(tmp_path):
  """selective_cut's 15% rule: the oracle ranking's own cut is not shown above 0.15 on any
  system, so the claim is "not testable" there, whatever C_i's cut; a rule the oracle meets
  (selective_per_depth) keeps C_i's verdict."""
  shutil.copy(os.path.join(ROOT, "results", "roundtrip", "results.json"), tmp_path)
  s = harness.rejudge(exp.EXPERIMENT, str(tmp_path))["summary"]
  by_id = {c["id"]: c for c in s["claims"]}
  oracle = {v["claim"]["arms"][0]: v for fam, vs in s["verdicts"].items()
            if fam.startswith("sanity@") for v in vs
            if v["claim"]["id"].startswith("selective_cut.oracle")}
  assert set(by_id["selective_cut"]["oracle_fails"]) == set(oracle) == {"kdv1d", "ks1d"}
  for system, v in oracle.items():
    assert v["verdict"] != harness.REPRODUCED
    assert v["lo"] <= 0  # the oracle's cut is not shown above the 0.15 threshold
    assert by_id["selective_cut"]["systems"][system] == harness.NOT_TESTABLE
  assert by_id["selective_cut"]["verdict"] == harness.NOT_TESTABLE
  assert by_id["selective_per_depth"]["oracle_fails"] == []
  assert by_id["selective_per_depth"]["systems"]["kdv1d"] == harness.REPRODUCED
