"""Real math data from local files: GSM8K (jsonl) and MATH (json), scored by answer
equivalence (``rlpost.tasks.answer_check``). Nothing is downloaded and no text is ever evaluated
as code.

A GSM8K line looks like ``{"question": ..., "answer": "... #### 72"}``; a MATH problem like
``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}", "level": "Level 3", "type": ...}``
(one file per problem, or a json list, or jsonl).
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable

from rlpost.tasks import answer_check, base
from rlpost.tasks.answer_check import (canonical_answer, extract_answer, extract_boxed,
                                       extract_gsm8k_answer)
from rlpost.tasks.base import format_prompt  # noqa: F401  (re-exported)


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
    records = []
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: invalid JSON ({e.msg})") from None
    return records
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
  return data if isinstance(data, list) else [data]


def _need_text(rec, key: str, path: str, i: int, alternative: str | None = None) -> None:
  """Raise naming the file and record index unless ``rec[key]`` is a string."""
  if not isinstance(rec, dict):
    raise ValueError(f"{path}: record {i} is a {type(rec).__name__}, expected an object")
  if key not in rec:
    also = f" (or {alternative!r})" if alternative else ""
    raise ValueError(f"{path}: record {i} has no field {key!r}{also}")
  if not isinstance(rec[key], str):
    raise ValueError(f"{path}: record {i} field {key!r} is a {type(rec[key]).__name__}, "
                     "expected text")


def load_gsm8k(path: str) -> list[dict]:
  """{prompt, answer, solution, difficulty} records from a GSM8K jsonl file, in GSM8K's own
  layout (``question``, ``answer`` ending "#### 72") or the project's record format
  (``rlpost.tasks.convert``: ``problem``, ``answer``, ``solution``, ``level``).

  Difficulty is the number of reasoning lines before ``####`` (a standard proxy).
  """
  records = []
  for i, rec in enumerate(_read_json_records(path)):
    if isinstance(rec, dict) and "problem" in rec:
      _need_text(rec, "problem", path, i)
      _need_text(rec, "answer", path, i)
      records.append({"prompt": rec["problem"], "answer": rec["answer"],
                      "solution": rec.get("solution", ""), "difficulty": int(rec.get("level", 0))})
      continue
    for key in ("question", "answer"):
      _need_text(rec, key, path, i)
    final = extract_gsm8k_answer(rec["answer"])
    if final is None:
      raise ValueError(f"{path}: record {i} has no '####' final answer")
    steps = rec["answer"].split("####")[0].strip().count("\n") + 1
    records.append({"prompt": rec["question"], "answer": final, "solution": rec["answer"],
                    "difficulty": steps})
  if not records:
    raise ValueError(f"{path}: no records")
  return records


def load_math(paths: str | Iterable[str]) -> list[dict]:
  """{prompt, answer, solution, difficulty, subject} records from MATH json files or a
  directory.

  A record needs ``problem`` and either ``answer`` (as in MATH-500 and the project's record
  format, ``rlpost.tasks.convert``) or a ``solution`` with a ``\\boxed{}`` answer (as in MATH).
  Difficulty is the number in ``level`` (1-5), else 0.
  """
  source = paths
  if isinstance(paths, str):
    if os.path.isdir(paths):
      paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(paths) for f in fs
                     if f.endswith((".json", ".jsonl")) and not f.endswith(".manifest.json"))
    else:
      paths = [paths]
  records = []
  paths = list(paths)
  for path in paths:
    for i, rec in enumerate(_read_json_records(path)):
      _need_text(rec, "problem", path, i)
      if "answer" not in rec:
        _need_text(rec, "solution", path, i, alternative="answer")
      final = rec.get("answer")
      if final is not None and not isinstance(final, (str, int, float)):
        raise ValueError(f"{path}: record {i} field 'answer' is a {type(final).__name__}, "
                         "expected text or a number")
      final = str(final).strip() if final is not None else ""
      if not final and isinstance(rec.get("solution"), str):
        final = extract_boxed(rec["solution"]) or ""
      if not final:
        raise ValueError(f"{path}: record {i} has no \\boxed{{}} answer in its solution and no "
                         "'answer' field")
      level = re.search(r"\d+", str(rec.get("level", "")))
      records.append({"prompt": rec["problem"], "answer": final,
                      "solution": rec.get("solution", ""),
                      "difficulty": int(level.group()) if level else 0,
                      "subject": rec.get("type", rec.get("subject", ""))})
  if not records:
    raise ValueError(f"no MATH records found in {source!r}")
  return records


def answer_tag(text: str) -> str | None:
  """The text of the last ``<answer>...</answer>``, commas removed; None without a closed tag
  or for the placeholder "..." (MC-GRPO's GSM8K trainer, ``extract_answer_from_model_output``)."""
  parts = text.split("<answer>")
  if len(parts) < 2 or "</answer>" not in parts[-1]:
    return None
  ans = parts[-1].split("</answer>")[0].strip().replace(",", "")
  return None if ans == "..." else ans


def _single_number(text: str) -> float | None:
  nums = re.findall(r"-?\d*\.?\d+", text)
  return float(nums[0]) if len(nums) == 1 else None


def mc_grpo_gsm8k_reward(completion: str, reference: str) -> float:
  """MC-GRPO's GSM8K reward (lotusroot-kim/MC-GRPO ``rewards_gsm.py``; the recipe's reward
  functions ``accuracy`` and ``format``, weights 1.0 each), in [0, 3]:

  * accuracy: 2.0 when the ``<answer>`` tag's text equals the reference (the text after "####",
    commas removed), else 1.5 when each holds exactly one number and the two are equal, else 0;
  * format: 1.0 when the completion holds a ``\\boxed{...}`` anywhere.

  A completion counts as correct when its accuracy part is non-zero, i.e. the reward >= 1.5.
  """
  got, want = answer_tag(completion), reference.strip().replace(",", "")
  if got == want:
    acc = 2.0
  else:
    g, w = _single_number(str(got)), _single_number(want)
    acc = 1.5 if g is not None and w is not None and g == w else 0.0
  return acc + (1.0 if re.search(r"\\boxed\{[^}]+\}", completion) else 0.0)


def gsm8k_reference(record: dict) -> str:
  """The reference MC-GRPO's GSM8K trainer compares with: the text after the solution's "####"
  (``extract_answer_from_dataset``), else the record's answer."""
  sol = record.get("solution") or ""
  return sol.split("####")[1].strip() if "####" in sol else record["answer"]


# --------------------------------------------------------------------------------------------
# Tasks for the RL trainer
# --------------------------------------------------------------------------------------------

# Qwen2.5-Math's chain-of-thought prompt in its chat format (the system prompt its model card
# recommends for CoT).
QWEN_MATH_TEMPLATE = ("<|im_start|>system\nPlease reason step by step, and put your final answer "
                      "within \\boxed{}.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
                      "<|im_start|>assistant\n")
# The same instruction without a chat format (for base models without chat tokens).
PLAIN_TEMPLATE = ("Question: {question}\nPlease reason step by step, and put your final answer "
                  "within \\boxed{}.\nAnswer:")

FILE_TASKS = ("gsm8k", "math")
SPLITS = base.SPLITS


def load_task(task: str, spec: dict) -> dict[str, list[dict]]:
  """The splits of a file task: {"train": records, "test": records}.

  Args:
    task: "gsm8k" (jsonl with ``question`` and ``answer``) or "math" (MATH json / jsonl files or
      a directory of them, see ``load_math``).
    spec: {"train": path, "test": path}; for "math" a path may also be a list of paths.

  Records are {prompt, answer, solution, difficulty}; GSM8K records get difficulty 0 (one
  bucket), MATH records their level 1-5. Raises FileNotFoundError naming the spec key and the
  path for a missing file, ValueError naming the file and record index for a malformed record.
  """
  if task not in FILE_TASKS:
    raise ValueError(f"unknown file task {task!r}; known: {list(FILE_TASKS)}")
  unknown = sorted(set(spec) - set(SPLITS))
  missing = [s for s in SPLITS if s not in spec]
  if unknown or missing:
    raise ValueError(f"{task} task_spec must be {{'train': path, 'test': path}} (local files); "
                     f"missing {missing}, unknown {unknown}")
  out = {}
  for split in SPLITS:
    paths = spec[split]
    many = isinstance(paths, (list, tuple))
    if task == "gsm8k" and many:
      raise ValueError(f"gsm8k task_spec[{split!r}] must be one jsonl path, got a list")
    for p in (paths if many else [paths]):
      if not isinstance(p, str) or not p:
        raise ValueError(f"{task} task_spec[{split!r}] must be a file path, got {p!r}")
      if not os.path.exists(p):
        raise FileNotFoundError(f"{task} task_spec[{split!r}]: {p} does not exist")
    if task == "gsm8k":
      out[split] = [dict(r, difficulty=0) for r in load_gsm8k(paths)]
    else:
      out[split] = load_math(list(paths) if many else paths)
  return out


class _FileTask(base.Task):
  """A real-text math task read from local files (``task_spec = {"train": path, "test":
  path}``), prompts formatted with the config's ``prompt_template``, scored by answer
  equivalence under the config's ``answer_check`` (``rlpost.tasks.answer_check``: the parser
  or math-verify)."""

  character_alphabet = False
  takes_prompt_template = True
  reads_files = True

  @classmethod
  def validate(cls, cfg) -> None:
    if set(cfg.task_spec) != set(SPLITS):
      raise ValueError("config key 'task_spec': must name local files: {'train': path, 'test': "
                       f"path}} (got {cfg.task_spec!r})")
    for split in SPLITS:
      paths = cfg.task_spec[split]
      many = cls.name == "math" and isinstance(paths, (list, tuple))
      if not all(isinstance(p, str) and p for p in (paths if many else [paths])) or (
          many and not paths):
        kind = "a file path or a list of them" if cls.name == "math" else "a file path"
        raise ValueError(f"config key 'task_spec': field {split!r} must be {kind}, got "
                         f"{paths!r}")

    why = answer_check.available(cfg.answer_check)
    if why:
      raise ValueError(f"config key 'answer_check': {why}")
    if "{question}" not in cfg.prompt_template:
      raise ValueError("config key 'prompt_template': must contain '{question}' (got "
                       f"{cfg.prompt_template!r})")

  def load(self, log):
    c = self.cfg
    data = load_task(self.name, c.task_spec)
    caps = {"train": c.num_train, "test": c.num_test}
    for split, records in data.items():
      if len(records) > caps[split]:
        log(f"{self.name} {split}: using the first {caps[split]} of {len(records)} records "
            f"(num_{split})")
        data[split] = records[:caps[split]]
    return data

  def score(self, completion: str, finished: bool, record: dict) -> float:
    return self.score_batch([completion], [finished], [record])[0]

  def score_batch(self, completions, finished, records):

    return answer_check.check(self.cfg.answer_check, completions,
                              [r["answer"] for r in records])

  def final_answer(self, completion: str):
    return canonical_answer(extract_answer(completion))

  def reference_answer(self, record: dict):
    return canonical_answer(record["answer"])


@base.register_task
class GSM8KTask(_FileTask):
  """GSM8K; ``graded_reward=true`` trains on MC-GRPO's GSM8K reward (``mc_grpo_gsm8k_reward``:
  the ``<answer>`` tag's accuracy, 2 or 1.5, plus 1 for a boxed answer; correct from 1.5)
  instead of 1 for an answer ``answer_check`` accepts."""

  name = "gsm8k"
  has_graded_reward = True

  @property
  def correct_at(self) -> float:
    return 1.5 if self.cfg.graded_reward else 1.0

  def score_batch(self, completions, finished, records):
    if not self.cfg.graded_reward:
      return super().score_batch(completions, finished, records)
    return [mc_grpo_gsm8k_reward(c, gsm8k_reference(r)) for c, r in zip(completions, records)]


@base.register_task
class MathTask(_FileTask):
  name = "math"
