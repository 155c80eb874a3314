"""GSM8K / MATH as trainer tasks: answer extraction, canonical answers, templates, file specs."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.tasks import math_data

ANSWERS = ["0.5", "\\frac{1}{2}", "\\dfrac12", "1/2", "2", "2.0", "x=2", "$2$", "1,000", "1000",
           "\\sqrt{2}", "\\sqrt{3}", "", "-3", "-\\frac{6}{2}", "\\text{yes}", "yes"]


def test_canonical_answer_agrees_with_is_equivalent():
  for a in ANSWERS:
    for b in ANSWERS:
      ca, cb = math_data.canonical_answer(a), math_data.canonical_answer(b)
      assert (ca is not None and ca == cb) == math_data.is_equivalent(a, b), (a, b)
  assert math_data.canonical_answer("0.5") == math_data.canonical_answer("\\dfrac12") == "1/2"
  assert math_data.canonical_answer(None) is None and math_data.canonical_answer(" $ $") is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20), st.text(max_size=20))
def test_canonical_answer_property(a, b):
  ca, cb = math_data.canonical_answer(a), math_data.canonical_answer(b)
  assert (ca is not None and ca == cb) == math_data.is_equivalent(a, b)


def test_extract_answer_order():
  assert math_data.extract_answer("x \\boxed{3} then 7") == "3"
  assert math_data.extract_answer("so\n#### 1,234") == "1234"
  assert math_data.extract_answer("it is 4, not 5.") == "5"
  assert math_data.extract_answer("no answer") is None


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
