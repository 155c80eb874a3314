"""The ACE experiment runs end to end at toy size and judges only the pre-declared arm."""

import json
import os

import pytest

from experiments import ace, harness
from scripts import reproduce


def test_arms_and_configs():
  sz = ace.Design()
  spec = ace.arms(sz)
  assert list(spec) == ["grpo", ace.MAIN]
  assert spec["grpo"] == {"recipe": "grpo", "recipe_args": {"kl_coef": 0.0}}
  cfg = ace.units(ace.get_config(False))[ace.MAIN].spec["arm"]
  assert cfg["recipe"] == "ace" and cfg["recipe_args"] == {"alpha": 0.5, "kl_coef": 0.0}
  assert cfg == dict(ace.base_config(sz), **spec[ace.MAIN])
  assert list(ace.arms(ace.Design(exploratory_alphas=(2.0,))))[-1] == "ace-softplus-mul-2.0"
  # the pre-declared design: the calibrated testbed, no KL, the reference pass in both arms
  base = ace.base_config(sz)
  assert base["log_confidence"] and base["num_prompts"] == 64 and base["steps"] == 100
  assert base["task_spec"] == dict(min_digits=2, max_digits=3, terms=2)
  assert not base.get("graded_reward") and base["eval_samples"] == 64
  assert sz.from_power() == 8 == sz.seeds


@pytest.mark.slow
def test_reproduce_ace_quick(tmp_path):
  out = tmp_path / "ace"
  reproduce.main(["ace", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "passk.png", "training.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  s = res["summary"]
  assert s["ks"] == [1, 2, 4, 8] and s["main"] == "ace-softplus-mul-0.5"
  assert set(s["verdicts"].values()) <= {"reproduced", "not reproduced", "inconclusive",
                                     harness.NOT_JUDGED}
  assert [c["claim"]["id"] for c in s["claims"]] == list(s["verdicts"])
  gate, paper = s["claims"][0], s["claims"][1:]
  assert gate["claim"]["family"] == "testbed" and gate["claim"]["arms"] == ["grpo"]
  assert gate["claim"]["center"] == s["start"]["pass@1"]
  assert all(c["claim"]["arms"] == [ace.MAIN, "grpo"] and c["claim"]["family"] == "ace"
             for c in paper)
  for name, sel in s["selectivity"].items():
    assert sel["shift_wrong_p10"]["mean"] <= sel["shift_wrong_p90"]["mean"]
    assert 0 <= sel["penalty_share_overconfident"]["mean"] <= 1
    assert 1 <= sel["weight_at"]["p10"] <= sel["weight_at"]["p90"]
  pass1 = next(c for c in s["claims"] if c["claim"]["id"] == "pass1_holds")
  assert pass1["claim"]["direction"] == "equivalent"
  assert pass1["claim"]["margin"] == ace.PASS1_MARGIN
  for arm in res["data"].values():
    assert arm["compilations"] == 1
    for key in ("overconfident_errors", "shift_wrong_p50", "penalty_share_overconfident"):
      assert len(arm["train"][key]) == res["config"]["steps"]  # both arms log them
  assert "## Paper claims" in (out / "table.md").read_text()
  assert "## How selective the penalty was" in (out / "table.md").read_text()
  table = (out / "table.md").read_text()
  before = json.loads((out / "results.json").read_text())
  harness.rejudge(ace.EXPERIMENT, str(out))
  after = json.loads((out / "results.json").read_text())
  assert after == before and (out / "table.md").read_text() == table


def test_gain_growth_is_a_per_seed_difference():
  sz = ace.Design(eval_samples=8)
  keys = [f"pass@{k}" for k in (1, 2, 4, 8)] + ["token_entropy"]

  def arm(p1, p8):
    per_seed = [dict({k: 0.5 for k in keys}, **{"pass@1": a, "pass@8": b}) for a, b in zip(p1, p8)]
    start = [{k: 0.1 for k in keys}] * 2
    return {"seeds": [0, 1], "evals": [{"per_seed": start}, {"per_seed": per_seed}],
            "train": {k: [[0.0, 0.0]] for k in ("overconfident_errors",) + ace.SELECTIVITY}}

  results = {"grpo": arm([0.3, 0.4], [0.5, 0.7]), ace.MAIN: arm([0.3, 0.5], [0.6, 0.9])}
  claim = {c.id: c for c in ace.claims(sz)}["passk_gain_grows_with_k"]
  assert claim.metric == "pass@8 - pass@1" and claim.arms == (ace.MAIN, "grpo")
  growth = ace.per_seed(results, sz)[claim.metric]
  assert {n: [round(x, 9) for x in v] for n, v in growth.items()} == {
      "grpo": [0.2, 0.3], ace.MAIN: [0.3, 0.4]}


def test_replication_design_runs_the_main_arms_at_fresh_seeds_from_the_pin():
  from experiments import testbeds

  committed = ace.get_config(False)
  config = ace.EXPERIMENT.replicate(dict(committed, exploratory_alphas=[0.25]), 4, 1000)
  units = ace.units(config)
  assert set(units) == {"grpo", ace.main_arm(ace.design(False))}
  for u in units.values():
    assert u.spec["seeds"] == [1000, 1001, 1002, 1003]
    assert u.spec["arm"]["init_params"] == testbeds.start("b23-sft")["init_params"]
    assert u.spec["arm"]["sft_steps"] == 0
  assert list(ace.units(committed).values())[0].spec["seeds"] == list(range(8))


def test_replicate_flag_errors():
  with pytest.raises(SystemExit) as e:
    reproduce.main(["ace", "--replicate", "--quick"])
  assert e.value.code == 2


def test_recheck_flag_errors(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    reproduce.main(["ace", "--recheck", "grpo", "--quick"])
  assert e.value.code == 2 and "--recheck reruns arms" in capsys.readouterr().err
  for flag in (["--full"], ["--sync-docs"], ["--seed-offset", "5"], ["--seeds", "3"]):
    with pytest.raises(SystemExit) as e:
      reproduce.main(["ace", "--recheck", "grpo", *flag])
    assert e.value.code == 2 and f"not with {flag[0]}" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    reproduce.main(["ace", "--seed-offset", "5", "--rejudge"])
  assert e.value.code == 2 and "--seed-offset applies to --replicate only" in \
      capsys.readouterr().err
  with pytest.raises(FileNotFoundError, match="--recheck: no committed results.json"):
    reproduce.main(["ace", "--recheck", "grpo", "--out", str(tmp_path)])
  # an arm the committed table does not have is refused before anything trains
  with pytest.raises(ValueError, match="--recheck nope: not an RL arm .* grpo, ace"):
    reproduce.main(["ace", "--recheck", "nope"])
