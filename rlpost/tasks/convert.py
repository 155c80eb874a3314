"""Converters from the papers' datasets, in the layouts they are published in, to the project's
record format (``scripts/prepare_data.py NAME SRC... --out DIR``). Local files only.

Record format: one JSON object per line in ``DIR/<split>.jsonl``, with

    problem   text: the question, without any instruction the source wraps around it
    answer    text: the final answer a completion is checked against
    solution  text: a worked solution, "" when the source has none
    level     int: the source's difficulty level, 0 when it has none
    subject   text: the source's subject or type, "" when it has none
    source    text: "<file name>:<row>" (row counted from 0 among the file's records)
    system    text, only when the source prompt carries system messages (kept, not used)

The ``math`` and ``gsm8k`` tasks read it (``task_spec={"train": "DIR/train.jsonl", ...}``). Beside
each split file, ``DIR/<split>.manifest.json`` records the converter, each source file's path,
size, SHA-256 and rows read, the records written and the file's SHA-256, the fields kept and what
was dropped and why. Nothing is ever overwritten: a split file or manifest that exists already
is refused before any file is read, and a conversion that fails leaves no file behind.

Sources (``CONVERTERS``; each takes .parquet, .jsonl or .json files, or directories of them):

    gsm8k          GSM8K: ``question``, ``answer`` ("... #### 72"); openai/gsm8k's parquet files
                   or the original train.jsonl / test.jsonl
    math           MATH (Hendrycks): ``problem``, ``solution`` with a \\boxed{} answer, ``level``
                   ("Level 3"), ``type``; the original MATH/{train,test}/<subject>/<n>.json tree
                   or a parquet / jsonl export of it
    math500        MATH-500: ``problem``, ``solution``, ``answer``, ``subject``, ``level`` (int)
    aime           AIME sets: ``problem`` (or ``question``), ``answer`` (text or int),
                   optional ``solution``; split "test" unless named
    dapo_math_17k  DAPO-Math-17K (verl layout): the problem inside DAPO's instruction in
                   ``prompt[-1].content``, ``reward_model.ground_truth``; the instruction is
                   removed and repeated problems are dropped (the published file holds each
                   problem many times)
    dars           DARS-Dataset: verl parquet files ``openr1`` (split train) and
                   ``capacity_val`` (split test)
    verl           any verl-style file: ``prompt`` a chat list (the last user message is the
                   problem, system messages kept in ``system``), ``reward_model.ground_truth``

A source's split comes from ``--split``, else from its file name (train / test / validation;
the DARS names above), else the converter's default; anything else is an error naming the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import time
from typing import Callable, Iterable, Iterator

from rlpost.tasks import answer_check, math_data

FORMAT = "rlpost-records/1"
FIELDS = ("problem", "answer", "solution", "level", "subject", "source", "system")
READABLE = (".parquet", ".jsonl", ".json")


class ConvertError(ValueError):
  """A source that cannot be converted; the message names the file and the row."""


# --------------------------------------------------------------------------------------------
# Reading sources
# --------------------------------------------------------------------------------------------


def _pyarrow_parquet():
  try:
    import pyarrow.parquet as pq
  except ImportError:
    raise ConvertError("reading .parquet files needs pyarrow: pip install 'rlpost[data]'") from None
  return pq


def read_rows(path: str) -> Iterator[tuple[str, dict]]:
  """(where, row) for each record of a .parquet, .jsonl or .json file, in file order; ``where``
  is "<path> row <i>" (i from 0), or "<path>:<line>" for jsonl."""
  if path.endswith(".parquet"):
    pq = _pyarrow_parquet()
    try:
      f = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
      raise ConvertError(f"{path}: not a readable parquet file ({e})") from None
    i = 0
    for batch in f.iter_batches(batch_size=4096):
      for row in batch.to_pylist():
        yield f"{path} row {i}", row
        i += 1
    return
  if path.endswith(".jsonl"):
    try:
      with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
          if not line.strip():
            continue
          try:
            row = json.loads(line)
          except json.JSONDecodeError as e:
            raise ConvertError(f"{path}:{n}: invalid JSON ({e.msg})") from None
          yield f"{path}:{n}", row
    except UnicodeDecodeError as e:
      raise ConvertError(f"{path}: not valid UTF-8 (byte {e.start})") from None
    return
  if path.endswith(".json"):
    try:
      rows = math_data._read_json_records(path)
    except ValueError as e:
      raise ConvertError(str(e)) from None
    for i, row in enumerate(rows):
      yield f"{path} row {i}", row
    return
  raise ConvertError(f"{path}: cannot read this file type (expected {', '.join(READABLE)})")


def source_files(src: str) -> list[str]:
  """The readable files of ``src``: itself, or those under a directory in sorted order."""
  if not os.path.exists(src):
    raise ConvertError(f"{src}: does not exist")
  if os.path.isfile(src):
    return [src]
  found = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(src) for f in fs
                 if f.endswith(READABLE) and not f.endswith(".manifest.json"))
  if not found:
    raise ConvertError(f"{src}: no {', '.join(READABLE)} files in this directory")
  return found


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------------


def _field(row, where: str, *names: str, required: bool = True):
  """The first of ``names`` present in ``row`` (a dict), else None or an error naming them."""
  if not isinstance(row, dict):
    raise ConvertError(f"{where}: a {type(row).__name__}, expected an object with fields")
  for n in names:
    if n in row and row[n] is not None:
      return row[n]
  if required:
    raise ConvertError(f"{where}: no field {' or '.join(repr(n) for n in names)}")
  return None


def _text(value, where: str, name: str, *, allow_number: bool = False) -> str:
  if isinstance(value, bool) or not isinstance(value, (str, int, float) if allow_number else str):
    kind = "text or a number" if allow_number else "text"
    raise ConvertError(f"{where}: field {name!r} is a {type(value).__name__}, expected {kind}")
  text = str(value).strip()
  if not text:
    raise ConvertError(f"{where}: field {name!r} is empty")
  return text


def _level(value) -> int:
  m = re.search(r"\d+", str(value if value is not None else ""))
  return int(m.group()) if m else 0


def _record(problem: str, answer: str, where: str, *, solution: str = "", level: int = 0,
            subject: str = "", system: str | None = None) -> dict:
  out = {"problem": problem, "answer": answer, "solution": solution or "", "level": int(level),
         "subject": subject or "", "source": _short_where(where)}
  if system:
    out["system"] = system
  return out


def _short_where(where: str) -> str:
  path, _, row = where.partition(" row ")
  if row:
    return f"{os.path.basename(path)}:{row}"
  path, _, line = where.rpartition(":")
  return f"{os.path.basename(path)}:line {line}"


# --------------------------------------------------------------------------------------------
# Converters
# --------------------------------------------------------------------------------------------


def gsm8k_record(row, where: str) -> dict:
  question = _text(_field(row, where, "question"), where, "question")
  solution = _text(_field(row, where, "answer"), where, "answer")
  final = answer_check.extract_gsm8k_answer(solution)
  if not final:
    raise ConvertError(f"{where}: field 'answer' has no '####' final answer")
  steps = solution.split("####")[0].strip().count("\n") + 1
  return _record(question, final, where, solution=solution, level=steps)


def math_record(row, where: str) -> dict:
  problem = _text(_field(row, where, "problem"), where, "problem")
  solution = _field(row, where, "solution", required=False) or ""
  if not isinstance(solution, str):
    raise ConvertError(f"{where}: field 'solution' is a {type(solution).__name__}, expected text")
  answer = _field(row, where, "answer", required=False)
  if answer is not None:
    answer = _text(answer, where, "answer", allow_number=True)
  else:
    if not solution:
      raise ConvertError(f"{where}: no field 'answer' or 'solution'")
    answer = answer_check.extract_boxed(solution)
    if not answer:
      raise ConvertError(f"{where}: field 'solution' has no \\boxed{{}} answer")
  subject = _field(row, where, "type", "subject", required=False) or ""
  return _record(problem, answer, where, solution=solution,
                 level=_level(_field(row, where, "level", required=False)), subject=str(subject))


def aime_record(row, where: str) -> dict:
  problem = _text(_field(row, where, "problem", "question", "Problem"), where, "problem")
  answer = _text(_field(row, where, "answer", "Answer"), where, "answer", allow_number=True)
  solution = _field(row, where, "solution", "Solution", required=False) or ""
  return _record(problem, answer, where, solution=solution if isinstance(solution, str) else "")


def _chat(row, where: str) -> tuple[str, str]:
  """(last user message, system messages joined) of a verl-style ``prompt`` chat list."""
  prompt = _field(row, where, "prompt")
  if isinstance(prompt, str):
    return _text(prompt, where, "prompt"), ""
  if not isinstance(prompt, (list, tuple)) or not prompt:
    raise ConvertError(f"{where}: field 'prompt' is a {type(prompt).__name__}, expected a chat "
                       "list of {role, content} messages")
  user, system = None, []
  for k, msg in enumerate(prompt):
    if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
      raise ConvertError(f"{where}: prompt message {k} is not a {{role, content}} message")
    if msg.get("role") == "user":
      user = msg["content"]
    elif msg.get("role") == "system":
      system.append(msg["content"])
  if user is None or not user.strip():
    raise ConvertError(f"{where}: field 'prompt' has no user message")
  return user.strip(), "\n\n".join(system)


def _ground_truth(row, where: str) -> str:
  rm = _field(row, where, "reward_model")
  gt = rm.get("ground_truth") if isinstance(rm, dict) else None
  if gt is None:  # parquet gives a missing struct field as None
    raise ConvertError(f"{where}: field 'reward_model' has no 'ground_truth'")
  if isinstance(gt, (list, tuple)):
    if len(gt) != 1:
      raise ConvertError(f"{where}: reward_model.ground_truth holds {len(gt)} answers, "
                         "expected one")
    gt = gt[0]
  return _text(gt, where, "reward_model.ground_truth", allow_number=True)


def verl_record(row, where: str) -> dict:
  problem, system = _chat(row, where)
  solution = _field(row, where, "target", "solution", required=False)
  return _record(problem, _ground_truth(row, where), where,
                 solution=solution if isinstance(solution, str) else "",
                 subject=str(_field(row, where, "data_source", required=False) or ""),
                 system=system)


# DAPO-Math-17K wraps each problem in this instruction (verl's DAPO recipe scores the
# "Answer:" line it asks for); the record keeps the problem alone.
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response "
               "should be of the form Answer: $Answer (without quotes) where $Answer is the "
               "answer to the problem.")
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'


def dapo_record(row, where: str) -> dict:
  rec = verl_record(row, where)
  text = rec["problem"]
  if not (text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX)):
    raise ConvertError(f"{where}: the prompt is not in DAPO-Math-17K's instruction (expected it "
                       "to start 'Solve the following math problem step by step.' and end with "
                       "the 'Answer:' reminder); convert it with 'verl' to keep it as it is")
  rec["problem"] = text[len(DAPO_PREFIX):-len(DAPO_SUFFIX)].strip()
  if not rec["problem"]:
    raise ConvertError(f"{where}: the DAPO prompt holds no problem")
  return rec


def _split_by_name(path: str, names: dict) -> str | None:
  base = os.path.basename(path).lower()
  parts = [p.lower() for p in os.path.normpath(path).split(os.sep)]
  for key, split in names.items():
    if key in base:
      return split
  for key, split in names.items():
    if key in parts:
      return split
  return None


STANDARD_SPLITS = {"train": "train", "test": "test", "validation": "test", "val": "test"}


@dataclasses.dataclass(frozen=True)
class Converter:
  """A source layout: how one row becomes a record, how a file's split is told, and whether
  repeated problems are dropped (keeping the first)."""

  name: str
  record: Callable[[dict, str], dict]
  split_names: dict = dataclasses.field(default_factory=lambda: dict(STANDARD_SPLITS))
  default_split: str | None = None
  dedupe: bool = False

  def split_of(self, path: str, forced: str | None = None) -> str:
    split = forced or _split_by_name(path, self.split_names) or self.default_split
    if not split:
      raise ConvertError(f"{path}: cannot tell its split from the name ({self.name} knows "
                         f"{sorted(set(self.split_names))}); pass --split")
    return split


CONVERTERS = {c.name: c for c in (
    Converter("gsm8k", gsm8k_record),
    Converter("math", math_record),
    Converter("math500", math_record, default_split="test"),
    Converter("aime", aime_record, default_split="test"),
    Converter("dapo_math_17k", dapo_record, default_split="train", dedupe=True),
    Converter("dars", verl_record,
              split_names={"capacity_val": "test", "openr1": "train", **STANDARD_SPLITS}),
    Converter("verl", verl_record),
)}


# --------------------------------------------------------------------------------------------
# A conversion
# --------------------------------------------------------------------------------------------


def plan(name: str, sources: Iterable[str], out: str, split: str | None = None) -> dict:
  """{split: [files]} of a conversion, checked before any file is read: the converter exists,
  every source exists, every split is told, and no output file exists yet."""
  if name not in CONVERTERS:
    raise ConvertError(f"unknown converter {name!r}; known: {sorted(CONVERTERS)}")
  conv = CONVERTERS[name]
  if split is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", split):
    raise ConvertError(f"--split {split!r}: use letters, digits, '_' or '-'")
  files: dict[str, list[str]] = {}
  for src in sources:
    for f in source_files(src):
      files.setdefault(conv.split_of(f, split), []).append(f)
  if os.path.exists(out) and not os.path.isdir(out):
    raise ConvertError(f"--out {out}: exists and is not a directory")
  for s in files:
    for path in (split_file(out, s), manifest_file(out, s)):
      if os.path.exists(path):
        raise ConvertError(f"{path}: exists already; rlpost never overwrites a prepared split "
                           "(choose another --out or move it away)")
  return files


def split_file(out: str, split: str) -> str:
  return os.path.join(out, f"{split}.jsonl")


def manifest_file(out: str, split: str) -> str:
  return os.path.join(out, f"{split}.manifest.json")


def convert_split(conv: Converter, files: list[str], *, dedupe: bool) -> tuple[list[dict], dict]:
  """The records of one split from its files, and what the manifest says about them."""
  records, seen, sources = [], set(), []
  duplicates = 0
  for path in files:
    n = 0
    for where, row in read_rows(path):
      n += 1
      rec = conv.record(row, where)
      if dedupe:
        if rec["problem"] in seen:
          duplicates += 1
          continue
        seen.add(rec["problem"])
      records.append(rec)
    if n == 0:
      raise ConvertError(f"{path}: no records")
    sources.append({"path": os.path.abspath(path), "bytes": os.path.getsize(path),
                    "sha256": sha256_file(path), "rows": n})
  dropped = {"repeated problem (the first kept)": duplicates} if duplicates else {}
  return records, {"sources": sources, "dropped": dropped}


def _write_atomic(path: str, text: str) -> None:
  d = os.path.dirname(path) or "."
  fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    if os.path.exists(path):
      raise ConvertError(f"{path}: appeared while converting; not overwritten")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def prepare(name: str, sources: Iterable[str], out: str, *, split: str | None = None,
            dedupe: bool | None = None, log: Callable[[str], None] = print) -> dict:
  """Convert ``sources`` with converter ``name`` into ``out``; returns {split: manifest}.

  Every split is converted in memory first; files are written only when all splits converted
  (records first, then each manifest), so a bad row anywhere leaves nothing behind.
  """
  files = plan(name, list(sources), out, split)
  conv = CONVERTERS[name]
  dedupe = conv.dedupe if dedupe is None else dedupe
  converted = {}
  for s, fs in files.items():
    t0 = time.time()
    records, info = convert_split(conv, fs, dedupe=dedupe)
    converted[s] = (records, info)
    dropped = sum(info["dropped"].values())
    log(f"{name} {s}: {len(records)} records from {sum(x['rows'] for x in info['sources'])} "
        f"rows of {len(fs)} file(s)" + (f", {dropped} dropped" if dropped else "")
        + f" ({time.time() - t0:.1f} s)")
  os.makedirs(out, exist_ok=True)
  manifests = {}
  for s, (records, info) in converted.items():
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    _write_atomic(split_file(out, s), text)
    kept = [f for f in FIELDS if any(f in r for r in records)]
    manifests[s] = {
        "format": FORMAT, "converter": name, "split": s, "file": os.path.basename(
            split_file(out, s)), "records": len(records),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "fields": kept,
        "deduplicated": dedupe, **info,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write_atomic(manifest_file(out, s), json.dumps(manifests[s], indent=1) + "\n")
    log(f"wrote {split_file(out, s)} and {os.path.basename(manifest_file(out, s))}")
  return manifests
