"""Claims as data judged by rlpost.eval.stats: directions, margins, equivalence, Holm."""

import json
import math
import os

import numpy as np
import pytest

from experiments import claims as claims_lib
from experiments import harness
from rlpost.eval import stats

HI = [1.0, 1.1, 0.9, 1.05]
LO = [0.0, 0.1, -0.1, 0.05]


def claim(**kw):
  base = dict(id="c", text="a beats b", metric="m", arms=("a", "b"))
  return harness.Claim(**{**base, **kw})


def judge(claims, a, b):
  return harness.judge_family(claims, {"m": {"a": a, "b": b}})


def test_directional_claims():
  (v,) = judge([claim()], HI, LO)
  assert v.verdict == "reproduced"
  assert v.p == pytest.approx(stats.t_test(HI, LO, alternative="greater"))
  # 4 vs 4 seeds: the exact one-sided permutation p is 1/C(8, 4) = 1/70 (reported only).
  assert v.p_permutation == pytest.approx(1 / 70)
  diff, lo, hi = stats.diff_interval(HI, LO)
  assert (v.diff, v.lo, v.hi) == (diff, lo, hi) and v.n == (4, 4)
  assert judge([claim()], LO, HI)[0].verdict == "not reproduced"
  assert judge([claim(direction="less")], LO, HI)[0].verdict == "reproduced"
  # A margin above the whole interval: the effect is real but smaller than claimed; the test is
  # against the margin.
  (v,) = judge([claim(margin=2.0)], HI, LO)
  assert v.verdict == "not reproduced" and v.p > 0.99
  # An interval that straddles the margin: inconclusive.
  (v,) = judge([claim(margin=1.0)], HI, LO)
  assert v.lo < 1.0 < v.hi and v.verdict == "inconclusive"
  # No spread, no difference: p = 1, inconclusive.
  assert judge([claim()], [1.0, 1.0], [1.0, 1.0])[0].verdict == "inconclusive"


def test_equivalence_claims():
  a, b = [0.50, 0.51, 0.49, 0.50, 0.505], [0.50, 0.49, 0.51, 0.495, 0.50]
  (v,) = judge([claim(direction="equivalent", margin=0.05)], a, b)
  assert v.verdict == "reproduced"
  p, lo, hi = stats.tost(a, b, 0.05)
  assert (v.p, v.lo, v.hi) == (p, lo, hi)
  assert judge([claim(direction="equivalent", margin=0.05)], HI, LO)[0].verdict == "not reproduced"
  noisy = [0.4, 0.6, 0.45, 0.55]
  assert judge([claim(direction="equivalent", margin=0.05)], noisy, b[:4])[0].verdict == \
      "inconclusive"


def test_holm_within_a_family_only():
  claims = [claim(id="x", family="f"), claim(id="y", family="f"), claim(id="z", family="g")]
  v = judge(claims, HI, LO)
  p = stats.t_test(HI, LO, alternative="greater")
  np.testing.assert_allclose([x.p_holm for x in v], [2 * p, 2 * p, p])
  assert v[0].mde > 0


def test_bad_claims_and_missing_values():
  with pytest.raises(ValueError, match="direction must be one of"):
    claim(direction="up")
  with pytest.raises(ValueError, match="margin must be"):
    claim(direction="equivalent", margin=0.0)
  with pytest.raises(KeyError, match="claim 'c': no per-seed values"):
    harness.judge_family([claim(arms=("a", "nope"))], {"m": {"a": HI}})
  with pytest.raises(ValueError, match="NaN|finite"):
    judge([claim()], [1.0, np.nan, 2.0], LO)


def test_rows():
  v = judge([claim()], HI, LO)
  rows = harness.verdict_rows(v)
  assert rows[2].startswith("| a beats b | a: +1.000 [") and rows[2].endswith("| reproduced |")
  assert harness.verdict_rows([x.to_json() for x in v]) == rows


def test_proportions_by_hand():
  # 0.2 of 100 vs 0.1 of 100: se = sqrt(0.16 / 100 + 0.09 / 100) = 0.05, z = 2, one-sided
  # p = 1 - Phi(2) = 0.02275, interval 0.1 -+ 1.96 * 0.05.
  rates = {"a": (0.2, 100), "b": (0.1, 100), "c": (0.15, 100)}
  v = harness.judge_proportions(claim(), rates)
  assert v["diff"] == pytest.approx(0.1) and v["z"] == pytest.approx(2.0)
  assert v["p"] == pytest.approx(0.02275, abs=1e-5)
  assert (v["lo"], v["hi"]) == pytest.approx((0.00200, 0.19800), abs=1e-5)
  assert v["verdict"] == "reproduced" and v["n"] == (100, 100)
  assert harness.judge_proportions(claim(direction="less"), rates)["verdict"] == "not reproduced"
  assert harness.judge_proportions(claim(arms=("b", "a"), direction="less"),
                                   rates)["verdict"] == "reproduced"
  # 0.15 vs 0.1: z = 0.05 / sqrt(0.002175) = 1.07, inconclusive; a margin shifts the test.
  v = harness.judge_proportions(claim(arms=("c", "b")), rates)
  assert v["z"] == pytest.approx(1.0721, abs=1e-4) and v["verdict"] == "inconclusive"
  v = harness.judge_proportions(claim(margin=0.05), rates)
  assert v["z"] == pytest.approx(1.0) and v["verdict"] == "inconclusive"
  # No spread, or an arm without trials: nothing to reject.
  v = harness.judge_proportions(claim(), {"a": (0.0, 10), "b": (0.0, 10)})
  assert v["p"] == 1.0 and v["verdict"] == "inconclusive"
  v = harness.judge_proportions(claim(), {"a": (0.0, 0), "b": (0.1, 100)})
  assert v["p"] == 1.0 and np.isnan(v["lo"]) and v["verdict"] == "inconclusive"
  with pytest.raises(ValueError, match="directional"):
    harness.judge_proportions(claim(direction="equivalent", margin=0.1), rates)
  with pytest.raises(ValueError, match="rates must lie"):
    harness.judge_proportions(claim(), {"a": (1.2, 10), "b": (0.1, 100)})
  with pytest.raises(KeyError, match="no rate for"):
    harness.judge_proportions(claim(arms=("a", "x")), rates)


# ------------------------------------------------------------------ the run skeleton
def _toy(calls: list):
  """An experiment of two arms x seeds whose units record that they ran."""

  def get_config(quick):
    return {"seeds": 2 if quick else 5, "shift": 1.0}

  def unit(arm, seeds, shift):
    def run(progress):
      calls.append(arm)
      rng = np.random.default_rng(len(arm))
      progress(1)
      return {"values": (rng.normal(size=seeds) + (shift if arm == "b" else 0.0)).tolist(),
              "curve": np.arange(3.0) * (arm == "b")}
    return harness.Unit({"arm": arm, "seeds": seeds, "shift": shift}, run)

  def units(config):
    return {arm: unit(arm, config["seeds"], config["shift"]) for arm in ("a", "b")}

  def collect(config, results):
    return {arm: {"values": r["values"], "curve_end": float(r["curve"][-1])}
            for arm, r in results.items()}

  claims = [harness.Claim("b_beats_a", "b beats a", "values", ("b", "a"), family="toy")]

  def summarize(report):
    values = {"values": {arm: d["values"] for arm, d in report["data"].items()}}
    return {"claims": [v.to_json() for v in harness.judge_family(claims, values)]}

  def render(report):
    return "\n".join(["# Toy", "", "## Paper claims", "",
                      *harness.verdict_rows(report["summary"]["claims"]), ""])

  return harness.Experiment("toy", get_config, units, summarize, render, collect=collect)


def _args(out, quick=True, seeds=None):
  import argparse
  return argparse.Namespace(quick=quick, seeds=seeds, out=str(out), no_progress=True)


def test_run_caches_units_and_rejudges_without_running(tmp_path):
  calls = []
  exp = _toy(calls)
  report = harness.run(exp, _args(tmp_path))
  assert sorted(calls) == ["a", "b"] and report["units_run"] == ["a", "b"]
  assert report["data"]["b"]["curve_end"] == 2.0  # the array went through the .npz cache
  assert report["config"] == {"seeds": 2, "shift": 1.0}
  assert report["command"] == "python scripts/reproduce.py toy --quick"
  assert report["machine"]["cpus"] >= 1 and "jax" in report["machine"]["versions"]
  assert len(report["data"]["a"]["values"]) == 2
  cached = sorted(os.listdir(tmp_path / "cache"))
  assert len([f for f in cached if f.endswith(".npz")]) == 2
  # A rerun computes nothing; a changed seed count reruns only what changed.
  again = harness.run(exp, _args(tmp_path))
  assert sorted(calls) == ["a", "b"] and again["units_run"] == []
  assert again["data"] == report["data"]
  more = harness.run(exp, _args(tmp_path, seeds=3))
  assert sorted(calls) == ["a", "a", "b", "b"] and len(more["data"]["a"]["values"]) == 3
  # Re-judging reads results.json only and rewrites identical files.
  written = {n: (tmp_path / n).read_text() for n in ("results.json", "table.md")}
  harness.rejudge(exp, str(tmp_path))
  assert {n: (tmp_path / n).read_text() for n in written} == written
  assert len(calls) == 4
  assert "| b beats a | b:" in written["table.md"]


def test_rejudge_rejects_foreign_results(tmp_path):
  (tmp_path / "results.json").write_text('{"arms": {}}')
  with pytest.raises(ValueError, match="not written by experiments/harness.py"):
    harness.rejudge(_toy([]), str(tmp_path))


def test_failed_unit_leaves_no_cache_entry(tmp_path):
  def boom(progress):
    raise FloatingPointError("step 3: loss is nan")

  exp = harness.Experiment("toy", lambda q: {"seeds": 1},
                           lambda c: {"x": harness.Unit({"x": 1}, boom)},
                           lambda r: {}, lambda r: "")
  with pytest.raises(FloatingPointError, match="step 3"):
    harness.run(exp, _args(tmp_path))
  assert not os.path.exists(tmp_path / "cache") or os.listdir(tmp_path / "cache") == []
  assert not os.path.exists(tmp_path / "results.json")


def test_paired_and_one_sample_claims():
  a, b = [1.0, 2.0, 3.0, 4.0], [0.9, 1.8, 2.95, 3.8]
  (paired,) = harness.judge_family([claim(paired=True)], {"m": {"a": a, "b": b}})
  d, lo, hi = stats.diff_interval(a, b, paired=True, method="t")
  assert (paired.diff, paired.lo, paired.hi) == pytest.approx((d, lo, hi))
  assert paired.p == pytest.approx(stats.t_test(a, b, paired=True, alternative="greater"))
  assert paired.verdict == "reproduced"  # the seed-to-seed spread cancels in the differences
  (unpaired,) = harness.judge_family([claim()], {"m": {"a": a, "b": b}})
  assert unpaired.verdict == "inconclusive"
  one = claim(arms=("a",), center=2.0)
  (v,) = harness.judge_family([one], {"m": {"a": a}})
  m, lo, hi = stats.mean_interval(np.asarray(a) - 2.0)
  assert (v.diff, v.lo, v.hi) == pytest.approx((m, lo, hi)) and v.verdict == "inconclusive"
  assert "a - 2" in harness.verdict_rows([v])[2]
  with pytest.raises(ValueError, match="arms must be"):
    claim(arms=("a", "b", "c"))


def test_fmt_and_protocol_note():
  assert harness.fmt(harness.cell([1.0])) == "1.000"
  assert harness.fmt({"mean": 0.1, "lo": -0.1, "hi": 0.3, "signed": True}) == (
      "+0.100 [-0.100, +0.300]")
  (v,) = judge([claim()], HI, LO)
  note = harness.protocol_note([v])
  assert "Welch" in note and "4 seeds per arm" in note and f"{v.sd:.3g}" in note
  assert "Holm-adjusted one-sided p" in harness.rules_note([v])


# ------------------------------------------------------------------ portability
def test_unit_key_follows_the_testbed_and_the_code(tmp_path):
  code = tmp_path / "extra.py"
  code.write_text("X = 1\n")

  def unit(init_params):
    return harness.Unit({"arm": {"init_params": init_params, "lr": 1e-4}}, lambda p: {},
                        code=(str(code),))

  a = unit(f"experiments/testbeds/b23-sft-{'1' * 16}.npz")
  b = unit(f"experiments/testbeds/b23-sft-{'2' * 16}.npz")
  key_a = harness.unit_key(a)
  assert harness.digest(key_a) != harness.digest(harness.unit_key(b))  # another start
  assert harness.testbeds_in(a.spec) == ["1" * 16]
  code.write_text("X = 2\n")  # the unit's code changed: so does its key
  assert harness.unit_key(a)["code"] != key_a["code"]
  assert harness.digest(harness.unit_key(a)) != harness.digest(key_a)
  with pytest.raises(harness.MixedStarts, match="start from 2 testbeds"):
    harness.run_units({"a": a, "b": b}, str(tmp_path / "cache"), "toy", no_progress=True)
  # Datasets: one per system; two systems may read two.
  kdv = {"system": "kdv1d", "testbed": f"experiments/testbeds/kdv1d-data0-{'3' * 16}.npz"}
  ks = {"system": "ks1d", "testbed": f"experiments/testbeds/ks1d-data0-{'4' * 16}.npz"}
  harness.check_one_testbed([kdv, ks], "toy")
  assert harness.testbeds_in([kdv, ks]) == ["3" * 16, "4" * 16]
  with pytest.raises(harness.MixedStarts, match="read 2 pinned datasets of system 'kdv1d'"):
    harness.check_one_testbed([kdv, dict(kdv, testbed=ks["testbed"])], "toy")


def test_unit_key_follows_the_modules_the_unit_imports(monkeypatch):
  """A table's unit runs code in its runner, config and helper modules besides the file that
  defines ``run``: an edit to any of them changes the key."""
  from experiments import averaging, roundtrip

  def rel(files):
    return {os.path.relpath(f, harness._ROOT) for f in files}

  import inspect

  sweep = averaging.units(averaging.get_config(True))["sweep"]
  cfg = roundtrip.cfg_lib.get_config(True)
  rt = next(iter(roundtrip.units(cfg).values()))
  assert {"experiments/averaging/sweep.py", "experiments/averaging/lm.py"} <= rel(
      harness._import_closure([inspect.getsourcefile(sweep.run)]))
  assert {"experiments/roundtrip/unit.py", "experiments/roundtrip/config.py",
          "experiments/testbeds/__init__.py"} <= rel(
              harness._import_closure([inspect.getsourcefile(rt.run)]))
  before = harness.unit_key(sweep)["code"]
  text = harness._code_text
  monkeypatch.setattr(harness, "_code_text", lambda path: text(path) + (
      "edited" if path.endswith(os.path.join("averaging", "lm.py")) else ""))
  assert harness.unit_key(sweep)["code"] != before


def _arm(pass1, **cfg):
  ev = {"pass@1": pass1, "token_entropy": 0.7}
  return {"config": dict({"init_params": "", "eval_problems": 200}, **cfg), "seeds": [0, 1],
          "evals": [{"step": 0, "per_seed": [ev, ev]}, {"step": 10, "per_seed": [ev, ev]}]}


def test_step0_guard_refuses_mixed_starts():
  harness.check_same_start({"arms": {"grpo": _arm(0.148), "ace": _arm(0.148, recipe="ace")}})
  # Other evaluation settings may give another step-0 evaluation: not compared.
  harness.check_same_start({"arms": {"grpo": _arm(0.148), "big": _arm(0.2, eval_problems=400)}})
  with pytest.raises(harness.MixedStarts, match=r"/arms/grpo and /arms/ace start from different "
                                                r"policies: step-0 pass@1 0.148 vs 0.247"):
    harness.check_same_start({"arms": {"grpo": _arm(0.148), "ace": _arm(0.247)}})


def test_writing_a_table_refuses_mixed_starts(tmp_path):
  """``harness.write`` runs the guard before judging: nothing reaches the output directory."""
  exp = harness.Experiment(name="toy", get_config=lambda quick: {}, units=lambda c: {},
                           summarize=lambda r: {}, render=lambda r: "table")
  mixed = {"config": {}, "data": {"arms": {"grpo": _arm(0.148), "ace": _arm(0.247)}}}
  with pytest.raises(harness.MixedStarts, match="start from different policies"):
    harness.write(exp, mixed, str(tmp_path))
  assert not os.listdir(tmp_path)
  harness.write(exp, {"config": {}, "data": {"arms": {"grpo": _arm(0.148)}}}, str(tmp_path))
  assert (tmp_path / "table.md").read_text() == "table"


def test_step0_guard_covers_a_table_with_its_own_layout():
  """averaging_rl keeps one step-0 pass@1 per seed unit (``t5_rl.starts``): the guard compares
  them, on the committed table and on a copy whose one seed started elsewhere."""
  import copy
  import json

  from experiments.averaging import t5_rl

  with open(os.path.join(harness._ROOT, "results", "averaging_rl", "results.json")) as f:
    report = json.load(f)
  starts = t5_rl.starts(report)
  assert len(starts) == report["config"]["seeds"] >= 2
  harness.check_starts(t5_rl.EXPERIMENT, report)
  moved = copy.deepcopy(report)
  moved["data"]["per_seed"][-1]["start"] += 0.01
  with pytest.raises(harness.MixedStarts, match="step-0 pass@1"):
    harness.check_starts(t5_rl.EXPERIMENT, moved)


def test_results_record_the_machine_and_each_unit(tmp_path):
  report = harness.run(_toy([]), _args(tmp_path))
  m = report["machine"]
  assert m["cpu_model"] == harness.cpu_model() and m["cpu_model"]
  assert 1 <= m["cpus_usable"] <= m["cpus"] and isinstance(m["env"], dict)
  assert isinstance(m["dirty"], bool) and m["commit"]
  assert set(report["units"]) == {"a", "b"}
  for prov in report["units"].values():
    assert prov["code"] and prov["cpu_model"] == m["cpu_model"] and "commit" in prov
  assert report["testbeds"] == []
  assert m["cpu_model"] in harness.machine_text(m)
  assert m["cpu_isa"] == harness.cpu_isa() and set(m["cpu_isa"]) <= set(harness.ISA_FLAGS)
  # The widest vector extension names the kernels XLA:CPU could use: it moves results.
  assert harness.isa_text(["sse4_2", "avx", "avx2", "avx512f"]) == "AVX-512"
  assert harness.isa_text(["avx", "avx2", "fma"]) == "AVX2"
  assert "(AVX2)" in harness.machine_text(dict(m, cpu_isa=["avx", "avx2"]))
  assert " (AVX" not in harness.machine_text(dict(m, cpu_isa=[]))


# ------------------------------------------------------------------ protocol v2: five outcomes
SMALL = [0.004, 0.005, 0.006, 0.005, 0.0045, 0.0055]  # +0.005 with a tight spread
ZERO = [0.0, 0.0005, -0.0005, 0.0, 0.0002, -0.0002]
NEAR0 = [-0.002, 0.003, 0.0, 0.001, -0.001, 0.002]  # +0.0005, tight around 0
WIDE = [0.05, -0.04, 0.06, -0.03, 0.02, -0.01]  # +0.0083, wide


def test_four_outcomes_of_a_directional_claim_by_hand():
  # Different from 0 and not shown smaller than the SESOI: reproduced.
  (v,) = judge([claim(sesoi=0.01)], HI, LO)
  assert v.verdict == "reproduced" and v.p_equivalent > 0.05
  assert judge([claim()], HI, LO)[0].p_equivalent is None  # no SESOI, no equivalence test
  # Different from 0, but its 90% interval lies inside +-0.01: trivial.
  (v,) = judge([claim(sesoi=0.01)], SMALL, ZERO)
  _, lo90, hi90 = stats.tost(SMALL, ZERO, 0.01)
  assert v.lo > 0 and v.p_holm <= 0.05 and -0.01 < lo90 and hi90 < 0.01
  assert v.verdict == "trivial"
  assert judge([claim()], SMALL, ZERO)[0].verdict == "reproduced"  # SESOI 0: no trivial outcome
  # Not different from 0 and equivalent to it within +-0.01: not reproduced.
  (v,) = judge([claim(sesoi=0.01)], NEAR0, ZERO)
  assert v.lo < 0 < v.hi and v.p_equivalent <= 0.05 and v.verdict == "not reproduced"
  # Neither: inconclusive.
  (v,) = judge([claim(sesoi=0.01)], WIDE, ZERO)
  assert v.lo < 0 < v.hi and v.p_equivalent > 0.05 and v.verdict == "inconclusive"
  # Wholly on the wrong side: not reproduced, whatever the SESOI.
  assert judge([claim(sesoi=0.01)], LO, HI)[0].verdict == "not reproduced"
  # "less" mirrors "greater".
  assert judge([claim(direction="less", sesoi=0.01)], ZERO, SMALL)[0].verdict == "trivial"


def test_no_gain_claims_are_one_sided_against_the_sesoi():
  def no_gain(**kw):
    return claim(text="no gain", direction="not_greater", **kw)

  # An upper bound below +SESOI: reproduced (a bounded null), with its p from the one-sided test.
  (v,) = judge([no_gain(sesoi=0.01)], NEAR0, ZERO)
  assert v.verdict == "reproduced" and v.note == ""
  assert v.p == pytest.approx(stats.t_test(np.array(NEAR0) - 0.01, ZERO, alternative="less"))
  # A gain of at least the SESOI (95% interval wholly above +0.01): not reproduced.
  assert judge([no_gain(sesoi=0.01)], HI, LO)[0].verdict == "not reproduced"
  # A gain significantly above 0 that may still lie below +SESOI: inconclusive, not refuted.
  (v,) = judge([no_gain(sesoi=0.01)], np.array(NEAR0) * 4 + 0.013, ZERO)
  assert 0 < v.lo < 0.01 < v.hi and v.verdict == "inconclusive"
  # Too noisy to bound: inconclusive.
  assert judge([no_gain(sesoi=0.01)], WIDE, ZERO)[0].verdict == "inconclusive"
  # Holds, but the arm is significantly worse: said beside the verdict.
  (v,) = judge([no_gain(sesoi=0.01)], ZERO, SMALL)
  assert v.verdict == "reproduced" and "significantly below 0" in v.note
  row = harness.verdict_rows([v])[-1]
  assert row.endswith("| reproduced; " + v.note + " |")
  with pytest.raises(ValueError, match="sesoi must be"):
    no_gain(sesoi=0.0)


def test_equivalence_that_holds_while_significantly_lower_says_so():
  a = [0.145, 0.143, 0.144, 0.142, 0.146, 0.144, 0.143, 0.145]
  b = [0.149, 0.150, 0.148, 0.151, 0.149, 0.150, 0.148, 0.149]
  (v,) = judge([claim(direction="equivalent", margin=0.01)], a, b)
  assert v.verdict == "reproduced"
  assert v.note.startswith("but a - b is significantly below 0 (95% interval [-0.00")
  (v,) = judge([claim(direction="equivalent", margin=0.05)],
               [0.50, 0.51, 0.49, 0.50, 0.505], [0.50, 0.49, 0.51, 0.495, 0.50])
  assert v.verdict == "reproduced" and v.note == ""


def test_rows_and_rules_show_sesoi_and_declaring_commit():
  (v,) = judge([claim(sesoi=0.015, declared="abc1234", exploratory=True)], HI, LO)
  row = harness.verdict_rows([v])[-1]
  assert "| 0.015 |" in row and "| abc1234 (exploratory) |" in row
  assert "*trivial*" in harness.rules_note([v]) and "STATISTICS.md" in harness.rules_note([v])
  # Results judged before v2 (no sesoi, no declaring commit) still render.
  old = v.to_json()
  old["claim"].pop("sesoi"), old["claim"].pop("declared")
  assert "| - |" in harness.verdict_rows([old])[-1]


# ------------------------------------------------------------------ replication
def _replicable(calls, shift_of=lambda offset: 1.0):
  """The toy table with seeds from ``seed_offset`` and a replication hook; ``shift_of(offset)``
  is arm b's true advantage in a run whose seeds start there."""
  import dataclasses as dc

  exp = _toy(calls)

  def get_config(quick):
    return {"seeds": 6, "shift": 1.0, "seed_offset": 0}

  def unit(arm, seeds, shift, offset):
    def run(progress):
      calls.append(arm)
      rng = np.random.default_rng([len(arm), offset])
      return {"values": (rng.normal(size=seeds) * 0.3 + (shift if arm == "b" else 0.0)).tolist(),
              "curve": np.zeros(3)}
    return harness.Unit({"arm": arm, "seeds": seeds, "shift": shift, "offset": offset,
                         "init_params": f"testbeds/toy-{'a' * 16}.npz"}, run)

  def units(config):
    off = config["seed_offset"]
    return {arm: unit(arm, config["seeds"], shift_of(off), off) for arm in ("a", "b")}

  def replicate(config, seeds, offset):
    return dict(config, seeds=seeds, seed_offset=offset)

  return dc.replace(exp, get_config=get_config, units=units, replicate=replicate)


def test_replication_report_on_a_committed_table(tmp_path, capsys):
  calls = []
  exp = _replicable(calls)
  committed = harness.run(exp, _args(tmp_path, quick=False))
  (v,) = committed["summary"]["claims"]
  assert v["verdict"] == "reproduced" and len(v["values"][0]) == 6
  calls.clear()
  committed_bytes = (tmp_path / "results.json").read_bytes()
  out = harness.replicate(exp, str(tmp_path), seeds=4, seed_offset=100, no_progress=True)
  assert (tmp_path / "results.json").read_bytes() == committed_bytes  # what it reads is kept
  assert sorted(calls) == ["a", "b"]  # only the replication's units ran
  (row,) = out["rows"]
  new = out["report"]["summary"]["claims"][0]
  assert len(new["values"][0]) == 4 and new["values"] != v["values"]
  dd, lo, hi, p = stats.diff_of_diffs(*v["values"], *new["values"])
  assert row["change"] == {"diff": dd, "lo": lo, "hi": hi, "p": p}
  assert row["same_verdict"] and row["agree"] == (p > 0.05)
  text = (tmp_path / "replication.md").read_text()
  assert text in capsys.readouterr().out  # printed as written
  assert "4 fresh seeds (from 100; the committed table used 6 seeds from 0)" in text
  assert f"{int(row['agree'])} of 1 claims agree" in text
  assert (tmp_path / "replication" / "results.json").exists()
  # both seed sets pooled, described beside the test (Welch over 6 + 4 seeds per arm)
  a, b = (list(x) + list(y) for x, y in zip(v["values"], new["values"]))
  d, lo, hi = stats.diff_interval(a, b)
  assert row["pooled"] == {"diff": d, "lo": lo, "hi": hi, "seeds": 10}
  assert text.splitlines()[next(i for i, line in enumerate(text.splitlines())
                                if line.startswith("| claim")) + 2].endswith(
      f"| {d:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
  committed_json = (tmp_path / "results.json").read_text()
  # Seeds the table used are refused before anything runs; the committed files are untouched.
  with pytest.raises(ValueError, match=r"seeds 3-6 overlap the committed table's 0-5"):
    harness.replicate(exp, str(tmp_path), seeds=4, seed_offset=3)
  assert (tmp_path / "results.json").read_text() == committed_json
  # Another seed set goes beside the committed replication, never over it.
  replication_md = (tmp_path / "replication.md").read_bytes()
  other = harness.replicate(exp, str(tmp_path), seeds=3, seed_offset=200, no_progress=True)
  assert (tmp_path / "replication.md").read_bytes() == replication_md
  assert other["markdown"] == str(tmp_path / "replication-200x3" / "replication.md")
  assert "3 fresh seeds (from 200" in (tmp_path / "replication-200x3" / "replication.md").read_text()
  assert (tmp_path / "replication-200x3" / "results.json").exists()
  # The same seed set again rewrites the committed replication (same design, same seeds).
  again = harness.replicate(exp, str(tmp_path), seeds=4, seed_offset=100, no_progress=True)
  assert again["markdown"] == str(tmp_path / "replication.md")
  # SESOI, declaring commit and any note travel into the report.
  header = next(line for line in text.splitlines() if line.startswith("| claim"))
  assert "| SESOI | declared |" in header and "protocol v2" in text


def test_replication_flags_a_changed_effect(tmp_path):
  exp = _replicable([], shift_of=lambda offset: 1.0 if offset == 0 else -1.0)
  harness.run(exp, _args(tmp_path, quick=False))
  out = harness.replicate(exp, str(tmp_path), seeds=6, seed_offset=50, no_progress=True)
  (row,) = out["rows"]
  assert row["new"]["verdict"] == "not reproduced" and not row["agree"]
  assert row["change"]["p"] < 0.001 and row["change"]["diff"] == pytest.approx(
      row["committed"]["diff"] - row["new"]["diff"])
  assert "0 of 1 claims agree" in (tmp_path / "replication.md").read_text()
  assert "Changes significant at 0.05: 1 of 1; chance alone gives 0.05 on average (P(>= 1) = " \
         "0.05 were" in (tmp_path / "replication.md").read_text()


def test_chance_note_counts_significant_changes_against_the_binomial():
  def row(p):
    return {"change": None if p is None else {"p": p}}
  # 3 of 7 changes at p <= 0.05: P(X >= 3) for X ~ Binomial(7, 0.05), by hand
  want = 1 - sum(math.comb(7, i) * 0.05**i * 0.95**(7 - i) for i in range(3))
  text = harness.chance_note([row(0.02), row(0.007), row(0.05), row(0.4), row(0.9), row(0.06),
                              row(0.3), row(None)])
  assert text.startswith("Changes significant at 0.05: 3 of 7; chance alone gives 0.35 on "
                         f"average (P(>= 3) = {want:.2g} were the claims independent")
  one = harness.chance_note([row(0.01), row(0.5)])
  assert one.endswith("were the claims independent).")  # no caveat about several at once
  assert harness.chance_note([row(0.5), row(0.2)]) == (
      "Changes significant at 0.05: 0 of 2; chance alone gives 0.1 on average.")
  assert harness.chance_note([row(None)]).startswith("No claim has per-seed values")


def test_verdicts_near_their_threshold_say_so():
  base = np.array([-0.01, 0.01, -0.005, 0.005, 0.0, 0.002])
  _, lo, _ = stats.mean_interval(base, level=0.9)
  a = base - lo + 0.0003  # one-sided 95% bound at +0.0003: reproduced, barely
  one = dict(arms=("a",), text="a above 0")
  (v,) = harness.judge_family([claim(**one)], {"m": {"a": a}})
  assert v.verdict == "reproduced" and v.p_holm < 0.05 and v.lo < 0
  assert v.note == (f"near its threshold (the deciding bound is 0.000 from it, under half the "
                    f"minimum detectable effect {v.mde:.3f})") and v.mde > 0.001
  (v,) = harness.judge_family([claim(**one)], {"m": {"a": a + 0.05}})
  assert v.verdict == "reproduced" and v.note == ""  # far from it
  (v,) = judge([claim()], HI, LO)
  assert v.note == ""


def test_replication_refuses_another_start(tmp_path):
  import dataclasses as dc

  exp = _replicable([])
  harness.run(exp, _args(tmp_path, quick=False))
  units = exp.units

  def other_start(config):
    return {k: dc.replace(u, spec=dict(u.spec, init_params=f"testbeds/toy-{'b' * 16}.npz"))
            for k, u in units(config).items()}

  with pytest.raises(ValueError, match=r"started from testbeds a{16}, the replication would "
                                       r"start from b{16}: a replication compares seeds"):
    harness.replicate(dc.replace(exp, units=other_start), str(tmp_path), seeds=2)
  assert not (tmp_path / "replication.md").exists()


def test_replication_of_a_table_with_nothing_to_pin(tmp_path):
  """A table declared ``pinned=False`` (its units start from their seeded initialisation)
  replicates without testbeds; a pinned table whose committed run names none is refused."""
  import dataclasses as dc

  exp = _replicable([])
  units = exp.units

  def unpinned(config):
    return {k: dc.replace(u, spec={n: v for n, v in u.spec.items() if n != "init_params"})
            for k, u in units(config).items()}

  exp = dc.replace(exp, units=unpinned)
  harness.run(exp, _args(tmp_path, quick=False))
  with pytest.raises(ValueError, match="started from an unpinned start"):
    harness.replicate(exp, str(tmp_path), seeds=2, no_progress=True)
  out = harness.replicate(dc.replace(exp, pinned=False), str(tmp_path), seeds=3,
                          no_progress=True)
  assert out["report"]["testbeds"] == [] and len(out["rows"]) == 1


def test_near_notes_for_less_and_equivalence_claims():
  base = np.array([-0.01, 0.01, -0.005, 0.005, 0.0, 0.002])
  _, lo90, hi90 = stats.diff_interval(base, np.zeros(6), level=0.9)
  # "less" beyond a threshold: a - b < -0.1, with the one-sided bound just past it.
  a = base - 0.1 - hi90 - 0.0002
  (v,) = judge([claim(direction="less", margin=0.1)], a, np.zeros(6))
  assert v.verdict == "reproduced" and "near its threshold" in v.note
  (v,) = judge([claim(direction="less", margin=0.1)], a - 0.05, np.zeros(6))
  assert v.verdict == "reproduced" and v.note == ""
  # Equivalence within 0.02 whose 90% interval ends just inside the margin.
  (v,) = judge([claim(direction="equivalent", margin=0.02)], base + 0.02 - hi90 - 0.0002,
               np.zeros(6))
  assert v.verdict == "reproduced" and "near its threshold" in v.note


def test_exploratory_claims_are_holm_adjusted_apart(monkeypatch):
  """Claims declared after the run that motivated them never share a Holm correction with the
  pre-declared claims of their family, and a table judged without knowing which is refused."""
  decl = {"x": {"declared": "aaa"}, "y": {"declared": "bbb", "exploratory": True}}
  monkeypatch.setattr(claims_lib, "declarations", lambda table: decl if table == "toy" else {})
  claims = [claim(id="x", family="f"), claim(id="y", family="f")]
  p = stats.t_test(HI, LO, alternative="greater")
  mixed = judge(claims, HI, LO)
  np.testing.assert_allclose([v.p_holm for v in mixed], [2 * p, 2 * p])
  apart = harness.judge_family(claims, {"m": {"a": HI, "b": LO}}, table="toy")
  np.testing.assert_allclose([v.p_holm for v in apart], [p, p])
  assert [v.claim.exploratory for v in apart] == [False, True]
  with pytest.raises(ValueError, match="claim 'y' is declared exploratory but was Holm-adjusted"):
    harness.declare("toy", {"claims": [v.to_json() for v in mixed]})
  stamped = harness.declare("toy", {"claims": [v.to_json() for v in apart]})["claims"]
  assert [(c["claim"]["declared"], c["claim"]["exploratory"]) for c in stamped] == [
      ("aaa", False), ("bbb", True)]


def test_equivalence_significantly_off_zero_says_so_whatever_its_verdict():
  """Protocol v2 point 4: an equivalence claim whose estimate is significant on one side says so
  beside the verdict, also when TOST does not reject (inconclusive)."""
  b = [0.150, 0.152, 0.148, 0.151, 0.149, 0.150, 0.147, 0.153]
  a = [0.146, 0.136, 0.143, 0.140, 0.145, 0.139, 0.144, 0.133]
  (v,) = judge([claim(direction="equivalent", margin=0.01)], a, b)
  assert v.verdict == "inconclusive" and v.lo < -0.01 < v.hi
  assert v.note.startswith("but a - b is significantly below 0")
  # A no-gain claim that is not reproduced keeps its verdict without the note (the rule itself
  # speaks to the gain).
  (v,) = judge([claim(direction="not_greater", sesoi=0.001)], [x + 0.02 for x in b], b)
  assert v.verdict == "not reproduced" and "significantly" not in v.note


def test_a_rule_no_oracle_is_shown_to_meet_is_not_testable_by_hand(monkeypatch):
  """Hand case for *not testable* (experiments/roundtrip/claims.py): C_i's selective cut is far
  above the 15% rule on both systems, but only on "b" is the oracle ranking shown to clear it;
  on "a" the oracle's own cut straddles 0.15, so the rule tests nothing about C_i there."""
  from experiments.roundtrip import claims as CL

  monkeypatch.setattr(CL, "per_seed_values", lambda values: values)
  seeds = 6
  jitter = np.linspace(-1, 1, seeds)

  def system(oracle_cut):
    vals = {CL.GATE.metric: list(0.9 + 0.01 * jitter)}
    for pc in CL.CLAIMS:
      for part in pc.parts:  # every part clearly met by C_i
        sign = -1 if part.direction == "less" else 1
        vals[part.metric] = list(part.center + sign * (0.3 + 0.01 * jitter))
    for _, part in CL.ATTAINABLE:
      vals[part.metric] = list(part.center + 0.3 + 0.01 * jitter)
    vals["cut_oracle_depth_mean"] = list(oracle_cut + 0.02 * jitter)
    return vals

  out = CL.judge({"a": system(CL.SELECTIVE_CUT), "b": system(CL.SELECTIVE_CUT + 0.2)},
                 {"a": "fair", "b": "fair"})
  cut = next(c for c in out["claims"] if c["id"] == "selective_cut")
  assert cut["oracle_fails"] == ["a"]
  assert cut["systems"] == {"a": harness.NOT_TESTABLE, "b": harness.REPRODUCED}
  assert cut["verdict"] == harness.INCONCLUSIVE  # the deciding systems disagree
  out = CL.judge({"a": system(CL.SELECTIVE_CUT)}, {"a": "fair"})
  cut = next(c for c in out["claims"] if c["id"] == "selective_cut")
  assert cut["verdict"] == harness.NOT_TESTABLE


def _rl_like(calls, drift):
  """A table whose units return ``rl_seeds.run_arm``-shaped arms (seeds, per-seed evaluations);
  ``drift[0]`` is added to every pass@1 of arm b, standing in for another machine."""
  import dataclasses as dc

  exp = _toy(calls)

  def unit(arm, seeds):
    def run(progress):
      calls.append(arm)
      base = np.arange(seeds) * 0.01 + (0.1 if arm == "b" else 0.0)
      evals = [{"step": s, "per_seed": [{"pass@1": float(v + s + (drift[0] if arm == "b" else 0)),
                                         "n": 3} for v in base]} for s in (0, 1)]
      return {"seeds": list(range(seeds)), "evals": evals, "values": base.tolist()}
    return harness.Unit({"arm": arm, "seeds": seeds}, run)

  def collect(config, results):
    return {"arms": dict(results)}

  def summarize(report):
    values = {"values": {a: d["values"] for a, d in report["data"]["arms"].items()}}
    claims = [harness.Claim("b_beats_a", "b beats a", "values", ("b", "a"), family="toy")]
    return {"claims": [v.to_json() for v in harness.judge_family(claims, values)]}

  return dc.replace(exp, units=lambda config: {a: unit(a, config["seeds"]) for a in "ab"},
                    collect=collect, summarize=summarize)


def test_recheck_retrains_committed_arms_and_compares_every_evaluation(tmp_path, capsys):
  calls, drift = [], [0.0]
  exp = _rl_like(calls, drift)
  harness.run(exp, _args(tmp_path, quick=False))
  committed = (tmp_path / "results.json").read_bytes()
  calls.clear()
  out = harness.recheck(exp, str(tmp_path), ["b"])
  assert calls == ["b"]  # retrained, not read from the cache
  assert out["b"]["bitwise"] and out["b"]["per_seed_max"] == [0.0] * 5
  assert "b: seeds 0-4, 2 evaluations: bitwise equal to the committed run" in \
      capsys.readouterr().out
  drift[0] = 0.004  # another machine: every pass@1 of b moved
  out = harness.recheck(exp, str(tmp_path), ["a", "b"])
  assert out["a"]["bitwise"] and not out["b"]["bitwise"]
  assert out["b"]["max_abs_diff"] == pytest.approx(0.004)
  assert "largest |difference| 0.004" in capsys.readouterr().out
  assert (tmp_path / "results.json").read_bytes() == committed  # what it reads is kept
  records = [json.loads(x) for x in (tmp_path / "recheck.jsonl").read_text().splitlines()]
  assert [sorted(r["arms"]) for r in records] == [["b"], ["a", "b"]]  # appended, one per call
  assert records[1]["arms"]["b"]["max_abs_diff"] == pytest.approx(0.004)
  assert records[1]["machine"]["cpu_model"] and "--recheck a b" in records[1]["command"]
  drift[0] = float("nan")  # a NaN where the committed run had a number is never "bitwise"
  out = harness.recheck(exp, str(tmp_path), ["b"])
  assert not out["b"]["bitwise"] and out["b"]["max_abs_diff"] == float("inf")
  calls.clear()
  with pytest.raises(ValueError, match=r"--recheck c: not an RL arm of the committed table .* "
                                       r"\(its arms: a, b\)"):
    harness.recheck(exp, str(tmp_path), ["b", "c"])
  assert calls == []  # refused before any training
