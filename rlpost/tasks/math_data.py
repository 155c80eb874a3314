"""Real math data from local files: GSM8K (jsonl) and MATH (json), with answer extraction and
equivalence checking. Nothing is downloaded and no text is ever evaluated as code.

GSM8K rows look like ``{"question": ..., "answer": "... #### 72"}``; MATH problems like
``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}", "level": "Level 3", "type": ...}``
(one file per problem, or a json list, or jsonl).
"""

from __future__ import annotations

import json
import os
import re
from fractions import Fraction
from typing import Iterable


def _read_json_records(path: str) -> list[dict]:
  """Records of a .jsonl file, a json list, or a single json object; errors name file and line."""
  try:
    with open(path, "rb") as f:
      raw = f.read()
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not valid UTF-8 (byte {e.start})") from None
  except OSError as e:
    raise ValueError(f"{path}: cannot read ({e.strerror})") from None
  if path.endswith(".jsonl"):
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: invalid JSON ({e.msg})") from None
    return rows
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
  return data if isinstance(data, list) else [data]


def extract_gsm8k_answer(answer: str) -> str | None:
  """The number after ``####`` with thousands separators removed, or None."""
  m = re.search(r"####\s*([^\n]+)", answer)
  if not m:
    return None
  return m.group(1).strip().replace(",", "").rstrip(".")


def extract_boxed(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced, or None."""
  starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
  if not starts:
    return None
  i = starts[-1]
  depth = 1
  j = i
  while j < len(text) and depth:
    depth += text[j] == "{"
    depth -= text[j] == "}"
    j += 1
  return text[i:j - 1].strip() if depth == 0 else None


def extract_final_number(text: str) -> str | None:
  """The last number in free text (for model outputs without a box or ####)."""
  nums = re.findall(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?", text)
  return nums[-1].replace(",", "") if nums else None


_LATEX_NOISE = [r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", "$", r"\displaystyle", "^\\circ",
                "^{\\circ}", r"\%", "%", r"\$", "dollars", "units"]


def normalize_answer(ans: str) -> str:
  """Canonical string form of a math answer (LaTeX noise removed, fractions unified)."""
  s = ans.strip()
  m = re.fullmatch(r"\\text\{(.*)\}", s)
  if m:
    s = m.group(1)
  for noise in _LATEX_NOISE:
    s = s.replace(noise, "")
  s = s.replace("dfrac", "frac").replace("tfrac", "frac").replace(" ", "")
  s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
  s = re.sub(r"^([a-zA-Z]\w*)=", "", s)  # "x=5" -> "5"
  s = s.rstrip(".")
  if s.startswith("0.") or re.fullmatch(r"-?\d+\.0+", s):
    s = s.rstrip("0").rstrip(".") if "." in s else s
  return s


def _as_number(s: str) -> Fraction | None:
  s = s.replace(",", "")
  m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
  try:
    if m:
      val = Fraction(int(m.group(2)), int(m.group(3)))
      return -val if m.group(1) else val
    if re.fullmatch(r"-?\d+/\d+", s):
      a, b = s.split("/")
      return Fraction(int(a), int(b))
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
      return Fraction(s)
  except (ValueError, ZeroDivisionError):
    return None
  return None


def is_equivalent(prediction: str | None, reference: str | None) -> bool:
  """Exact numeric equality when both sides parse as numbers, else normalised string equality."""
  if prediction is None or reference is None:
    return False
  p, r = normalize_answer(prediction), normalize_answer(reference)
  pn, rn = _as_number(p), _as_number(r)
  if pn is not None and rn is not None:
    return pn == rn
  return p == r and p != ""


def load_gsm8k(path: str) -> list[dict]:
  """{prompt, answer, solution, difficulty} rows from a GSM8K jsonl file.

  Difficulty is the number of reasoning lines before ``####`` (a standard proxy).
  """
  rows = []
  for i, rec in enumerate(_read_json_records(path)):
    for key in ("question", "answer"):
      if not isinstance(rec, dict) or key not in rec:
        raise ValueError(f"{path}: record {i} has no field {key!r}")
    final = extract_gsm8k_answer(rec["answer"])
    if final is None:
      raise ValueError(f"{path}: record {i} has no '####' final answer")
    steps = rec["answer"].split("####")[0].strip().count("\n") + 1
    rows.append({"prompt": rec["question"], "answer": final, "solution": rec["answer"],
                 "difficulty": steps})
  if not rows:
    raise ValueError(f"{path}: no records")
  return rows


def load_math(paths: str | Iterable[str]) -> list[dict]:
  """{prompt, answer, solution, difficulty, subject} rows from MATH json files or a directory."""
  if isinstance(paths, str):
    if os.path.isdir(paths):
      paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(paths) for f in fs
                     if f.endswith((".json", ".jsonl")))
    else:
      paths = [paths]
  rows = []
  for path in paths:
    for i, rec in enumerate(_read_json_records(path)):
      for key in ("problem", "solution"):
        if not isinstance(rec, dict) or key not in rec:
          raise ValueError(f"{path}: record {i} has no field {key!r}")
      final = rec.get("answer") or extract_boxed(rec["solution"])
      if final is None:
        raise ValueError(f"{path}: record {i} has no \\boxed{{}} answer in its solution")
      level = re.search(r"\d+", str(rec.get("level", "")))
      rows.append({"prompt": rec["problem"], "answer": final, "solution": rec["solution"],
                   "difficulty": int(level.group()) if level else 0,
                   "subject": rec.get("type", "")})
  if not rows:
    raise ValueError(f"no MATH records found in {list(paths)}")
  return rows


def score_math(completion: str, reference: str) -> float:
  """1.0 if the completion's boxed (else last) answer is equivalent to the reference."""
  pred = extract_boxed(completion)
  if pred is None:
    pred = extract_gsm8k_answer(completion) or extract_final_number(completion)
  return float(is_equivalent(pred, reference))
