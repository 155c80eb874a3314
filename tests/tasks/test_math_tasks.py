"""GSM8K / MATH as trainer tasks: answer extraction, canonical answers, templates, file specs."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.tasks import answer_check, math_data

ANSWERS = ["0.5", "\\frac{1}{2}", "\\dfrac12", "1/2", "2", "2.0", "x=2", "$2$", "1,000", "1000",
           "\\sqrt{2}", "\\sqrt{3}", "", "-3", "-\\frac{6}{2}", "\\text{yes}", "yes"]


def test_canonical_answer_agrees_with_is_equivalent():
  for a in ANSWERS:
    for b in ANSWERS:
      ca, cb = answer_check.canonical_answer(a), answer_check.canonical_answer(b)
      assert (ca is not None and ca == cb) == answer_check.is_equivalent(a, b), (a, b)
  assert answer_check.canonical_answer("0.5") == answer_check.canonical_answer("\\dfrac12") == "1/2"
  assert answer_check.canonical_answer(None) is None and answer_check.canonical_answer(" $ $") is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20), st.text(max_size=20))
def test_canonical_answer_property(a, b):
  ca, cb = answer_check.canonical_answer(a), answer_check.canonical_answer(b)
  assert (ca is not None and ca == cb) == answer_check.is_equivalent(a, b)


def test_extract_answer_order():
  assert answer_check.extract_answer("x \\boxed{3} then 7") == "3"
  assert answer_check.extract_answer("so\n#### 1,234") == "1234"
  assert answer_check.extract_answer("it is 4, not 5.") == "5"
  assert answer_check.extract_answer("no answer") is None


def test_format_prompt_is_plain_substitution():
  t = "Q: {question} {0} {question.__class__} \\boxed{}"
  assert math_data.format_prompt(t, "1+1?") == "Q: 1+1? {0} {question.__class__} \\boxed{}"
  assert math_data.format_prompt(math_data.QWEN_MATH_TEMPLATE, "{x}").count("{x}") == 1
  assert "\\boxed{}" in math_data.QWEN_MATH_TEMPLATE


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_load_task_specs_and_records(tmp_path):
  gsm = _jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "a\nb\n#### 3"}])
  out = math_data.load_task("gsm8k", {"train": gsm, "test": gsm})
  assert out["train"][0]["difficulty"] == 0 and out["test"][0]["answer"] == "3"
  m500 = _jsonl(tmp_path / "m.jsonl", [{"problem": "p", "answer": "\\frac12", "level": 5,
                                        "subject": "Algebra"}])
  mdir = tmp_path / "MATH"
  mdir.mkdir()
  (mdir / "1.json").write_text(json.dumps({"problem": "p", "solution": "\\boxed{2}",
                                           "level": "Level 3", "type": "Geometry"}))
  out = math_data.load_task("math", {"train": [str(mdir / "1.json"), m500], "test": str(mdir)})
  assert [(r["answer"], r["difficulty"], r["subject"]) for r in out["train"]] == [
      ("2", 3, "Geometry"), ("\\frac12", 5, "Algebra")]
  with pytest.raises(ValueError, match=r"missing \['test'\], unknown \['dev'\]"):
    math_data.load_task("math", {"train": m500, "dev": m500})
  with pytest.raises(ValueError, match="must be one jsonl path"):
    math_data.load_task("gsm8k", {"train": [gsm], "test": gsm})
  with pytest.raises(FileNotFoundError, match=r"gsm8k task_spec\['test'\]: .*nope.jsonl does not"):
    math_data.load_task("gsm8k", {"train": gsm, "test": str(tmp_path / "nope.jsonl")})
  with pytest.raises(ValueError, match="unknown file task"):
    math_data.load_task("mmlu", {})
  bad = _jsonl(tmp_path / "b.jsonl", [{"problem": "p", "answer": "1"}, ["not", "an object"]])
  with pytest.raises(ValueError, match="b.jsonl: record 1 is a list, expected an object"):
    math_data.load_math(bad)
  bad = _jsonl(tmp_path / "c.jsonl", [{"problem": "p"}])
  with pytest.raises(ValueError, match=r"record 0 has no field 'solution' \(or 'answer'\)"):
    math_data.load_math(bad)
  bad = _jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": 3}])
  with pytest.raises(ValueError, match="d.jsonl: record 0 field 'answer' is a int"):
    math_data.load_gsm8k(bad)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="no MATH records found in .*empty"):
    math_data.load_math(str(empty))


GSM_CASES = [  # (completion, reference text after "####", MC-GRPO's GSM8K reward)
    ("so <answer> 1,250 </answer>", "1,250", 2.0),  # the tag's text equals, commas removed
    ("<answer> 1250 </answer> \\boxed{1250}", "1250", 3.0),  # plus the format reward
    ("<answer>$1250</answer>", "1250", 1.5),  # one number each, numerically equal
    ("<answer>1250.0</answer>", "1250", 1.5),
    ("<answer>1250 or 12</answer>", "1250", 0.0),  # two numbers: no partial credit
    ("the answer is \\boxed{1250}", "1250", 1.0),  # no tag: the format part only
    ("<answer>...</answer>", "...", 0.0),  # the prompt's placeholder never matches
    ("<answer>1250", "1250", 0.0),  # an unclosed tag
    ("<answer>7</answer> later <answer>1250</answer>", "1250", 2.0),  # the last tag
]


def test_mc_grpo_gsm8k_reward_hand_values():
  got = [math_data.mc_grpo_gsm8k_reward(c, r) for c, r, _ in GSM_CASES]
  assert got == [w for _, _, w in GSM_CASES]
  assert math_data.gsm8k_reference({"solution": "a\n#### 1,250", "answer": "1250"}) == "1,250"
  assert math_data.gsm8k_reference({"answer": "12"}) == "12"


def test_gsm8k_graded_reward_and_where_correct_starts():
  import types

  import jax.numpy as jnp
  import numpy as np

  from rlpost.tasks import base

  recs = [{"answer": "1250", "solution": "x\n#### 1,250"}] * len(GSM_CASES)
  graded = math_data.GSM8KTask(types.SimpleNamespace(graded_reward=True, answer_check="parser"))
  plain = math_data.GSM8KTask(types.SimpleNamespace(graded_reward=False, answer_check="parser"))
  comps = [c for c, _, _ in GSM_CASES]
  rewards = graded.score_batch(comps, [True] * len(comps), recs)
  assert list(rewards) == [2.0, 3.0, 1.5, 1.5, 0.0, 1.0, 0.0, 0.0, 2.0]
  assert graded.correct_at == 1.5 and plain.correct_at == 1.0
  # Without graded_reward the answer checker decides 0/1: the boxed-only completion is right.
  assert plain.score_batch(comps[5:6], [True], recs[:1]) == [1.0]
  # host_reward's correct flag starts at the task's correct_at: a format-only 1.0 is wrong.
  fn = lambda tokens, mask, idx, split: np.asarray(rewards, np.float32)  # noqa: E731
  z = jnp.zeros((len(comps), 2), jnp.int32)
  r, ok = base.host_reward(fn, z, z > 0, jnp.arange(len(comps)), split_id=0,
                           correct_at=graded.correct_at)
  assert list(np.asarray(ok)) == [True, True, True, True, False, False, False, False, True]
  assert np.allclose(r, rewards)
