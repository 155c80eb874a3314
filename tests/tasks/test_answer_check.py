"""Answer checking (rlpost.tasks.answer_check): the parser and math-verify on a fixture of hard
cases, both behind the file task's ``score``; math-verify's workers bounded by a deadline; the
config key refused early where it cannot apply."""

from __future__ import annotations

import importlib.util
import types

import numpy as np
import pytest

from rlpost.tasks import answer_check, base, math_data
from rlpost.train import rl

# (completion, reference, parser's score, math-verify's score). Where they differ, the comment
# says which is right.
CASES = [
    # fractions and decimals
    ("The answer is $\\boxed{\\frac{1}{2}}$.", "0.5", 1, 1),
    ("So $x = \\boxed{0.5}$", "\\frac{1}{2}", 1, 1),
    ("$\\boxed{\\dfrac{3}{4}}$", "\\frac34", 1, 1),
    ("Thus \\boxed{1/2}", "\\frac{1}{2}", 1, 1),
    # units, degrees and percent
    ("The length is \\boxed{5\\text{ cm}}", "5", 0, 1),  # right: 5; the parser keeps the unit
    ("The angle is \\boxed{30^\\circ}", "30", 1, 1),
    ("It is \\boxed{25\\%}", "25", 1, 1),
    # several boxed answers: the parser takes the last; math-verify reads "3, finally 4" as the
    # set {3, 4}, which matches neither (the completion does not commit to one answer)
    ("First \\boxed{3}, finally \\boxed{4}", "4", 1, 0),
    ("First \\boxed{3}, finally \\boxed{4}", "3", 0, 0),
    ("First \\boxed{3}. Finally the answer is \\boxed{4}.", "4", 1, 1),
    # latex that needs algebra: only math-verify is right
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 0, 1),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 0, 1),
    ("\\boxed{\\{1, 2\\}}", "\\{2,1\\}", 0, 1),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 0, 1),
    ("\\boxed{\\text{(B)}}", "B", 0, 1),
    # tuples, intervals, signs, thousands, equations
    ("\\boxed{(1, 2)}", "(1,2)", 1, 1),
    ("\\boxed{[0, \\infty)}", "[0,\\infty)", 1, 1),
    ("\\boxed{-7}", "-7", 1, 1),
    ("\\boxed{1,000}", "1000", 1, 1),
    ("\\boxed{x=3}", "3", 1, 1),
    # free text
    ("So the answer is 72.", "72", 1, 1),
    ("#### 72", "72", 1, 1),
    # wrong or missing: both 0 (pi is not 3.14159 to 6 decimals)
    ("\\boxed{\\pi}", "3.14159", 0, 0),
    ("no answer here", "5", 0, 0),
    ("\\boxed{12}", "13", 0, 0),
]


def test_both_checkers_on_the_hard_cases():
  completions = [c[0] for c in CASES]
  references = [c[1] for c in CASES]
  for checker, col in (("parser", 2), ("math_verify", 3)):
    got = answer_check.check(checker, completions, references)
    want = [float(c[col]) for c in CASES]
    wrong = [(c[0], c[1], g) for c, g, w in zip(CASES, got, want) if g != w]
    assert not wrong, (checker, wrong)
  # The two disagree on the cases the fixture names, both ways.
  par = answer_check.check("parser", completions, references)
  mv = answer_check.check("math_verify", completions, references)
  assert sum(p > m for p, m in zip(par, mv)) == 1 and sum(m > p for p, m in zip(par, mv)) == 6


def file_task(checker: str) -> math_data.MathTask:
  return math_data.MathTask(types.SimpleNamespace(answer_check=checker))


def test_both_sit_behind_the_tasks_score():
  recs = [{"answer": c[1]} for c in CASES]
  for checker, col in (("parser", 2), ("math_verify", 3)):
    task = file_task(checker)
    batch = task.score_batch([c[0] for c in CASES], [True] * len(CASES), recs)
    assert list(batch) == [float(c[col]) for c in CASES]
    assert task.score(CASES[10][0], True, recs[10]) == float(CASES[10][col])


def test_host_scorer_calls_score_batch_once_per_batch():
  calls = []

  class Counting(math_data.MathTask):
    def score_batch(self, completions, finished, records):
      calls.append(len(completions))
      return super().score_batch(completions, finished, records)

  class Tok:
    def decode(self, ids):
      return "".join(chr(int(i)) for i in ids)

  text = [ord(ch) for ch in "\\boxed{2}"]
  tokens = np.array([text, text], np.int32)
  mask = np.ones_like(tokens, bool)
  mask[1, -2] = False  # "\boxed{}" with its last digit masked: no number
  fn = base.host_scorer(Counting(types.SimpleNamespace(answer_check="math_verify")),
                        {"train": [{"answer": "2"}], "test": []}, Tok(), stop_tokens=[0])
  assert list(fn(tokens, mask, np.array([0, 0]), 0)) == [1.0, 0.0] and calls == [2]


def test_math_verify_workers_are_bounded_by_a_deadline(monkeypatch):
  pairs = (["\\boxed{\\sqrt{8}}"] * 3, ["2\\sqrt{2}"] * 3)
  assert answer_check.check("math_verify", *pairs) == [1.0] * 3  # precondition: they score 1
  answer_check.WORKERS.kill()
  before = answer_check.WORKERS.timeouts
  # A deadline no fresh worker can meet: the answers score 0, are counted, and the late
  # workers are killed rather than waited for.
  monkeypatch.setattr(answer_check, "_deadline", lambda n, w: 0.01)
  assert answer_check.check("math_verify", *pairs) == [0.0] * 3
  assert answer_check.WORKERS.timeouts - before == 3
  assert not answer_check.WORKERS.procs
  monkeypatch.undo()
  assert answer_check.check("math_verify", *pairs) == [1.0] * 3


def test_config_refuses_what_cannot_apply(monkeypatch, tmp_path):
  with pytest.raises(ValueError, match=r"config key 'answer_check': only the file tasks"):
    rl.RLConfig(task="arithmetic", answer_check="math_verify").validate()
  with pytest.raises(ValueError, match=r"config key 'answer_check': must be one of"):
    rl.RLConfig(task="arithmetic", answer_check="sympy").validate()
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "math_verify" else real(name, *a))
  assert "pip install 'rlpost[data]'" in answer_check.available("math_verify")
  with pytest.raises(ValueError, match=r"needs the math-verify package"):
    answer_check.check("math_verify", ["\\boxed{1}"], ["1"])
  assert answer_check.available("parser") is None
  with pytest.raises(ValueError, match=r"2 completions but 1 references"):
    answer_check.check("parser", ["a", "b"], ["1"])
