"""scripts/prepare_data.py and rlpost.tasks.convert: each converter on a small fixture written in
its source's published layout (column names, nesting and file names as published), read back by
the tasks; bad files refused with one line naming the file and the row, nothing written."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.cli import run_main
from rlpost.tasks import answer_check, convert, math_data
from scripts import prepare_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_parquet(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)


def write_jsonl(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def cli(*args):
  """Run the command in-process; its exit status."""
  with pytest.raises(SystemExit) as e:
    run_main(prepare_data.main, list(args))
  return e.value.code


def verl_row(problem, truth, *, system=None, source="math", index=0, **extra):
  prompt = ([{"content": system, "role": "system"}] if system else []) + [
      {"content": problem, "role": "user"}]
  return {"data_source": source, "prompt": prompt, "ability": "MATH",
          "reward_model": {"ground_truth": truth, "style": "rule"},
          "extra_info": {"index": index, "split": "train"}, **extra}


def test_gsm8k_parquet_and_jsonl_layouts(tmp_path, capsys):
  rows = [{"question": "Tom has 3 apples and buys 4. How many?",
           "answer": "He has 3 + 4 = <<3+4=7>>7.\n#### 7"},
          {"question": "A car costs $1,000 more than $250. Price?",
           "answer": "1000 + 250 = 1250\nSo 1,250.\n#### 1,250"}]
  # openai/gsm8k on the Hugging Face hub: main/{train,test}-00000-of-00001.parquet.
  write_parquet(tmp_path / "gsm8k" / "main" / "train-00000-of-00001.parquet", rows)
  write_parquet(tmp_path / "gsm8k" / "main" / "test-00000-of-00001.parquet", rows[:1])
  out = tmp_path / "out"
  assert cli("gsm8k", str(tmp_path / "gsm8k"), "--out", str(out)) == 0
  train = read_jsonl(out / "train.jsonl")
  assert [r["answer"] for r in train] == ["7", "1250"]
  assert train[1] == {"problem": rows[1]["question"], "answer": "1250",
                      "solution": rows[1]["answer"], "level": 2, "subject": "",
                      "source": "train-00000-of-00001.parquet:1"}
  data = math_data.load_task("gsm8k", {"train": str(out / "train.jsonl"),
                                       "test": str(out / "test.jsonl")})
  assert [r["answer"] for r in data["train"]] == ["7", "1250"] and len(data["test"]) == 1
  assert data["train"][0]["prompt"] == rows[0]["question"]
  # The original repository's data/train.jsonl, and the converted file reads as the raw one.
  raw = write_jsonl(tmp_path / "grade_school_math" / "data" / "train.jsonl", rows)
  assert cli("gsm8k", raw, "--out", str(tmp_path / "out2")) == 0
  assert [r["answer"] for r in read_jsonl(tmp_path / "out2" / "train.jsonl")] == ["7", "1250"]
  assert [r["answer"] for r in math_data.load_gsm8k(raw)] == ["7", "1250"]
  assert "gsm8k train: 2 records from 2 rows of 1 file(s)" in capsys.readouterr().out


def test_math_tree_and_math500(tmp_path):
  # The MATH release: MATH/{train,test}/<subject>/<n>.json, one problem per file.
  probs = {
      "train/algebra/1.json": {"problem": "Solve $2x=1$.", "level": "Level 2", "type": "Algebra",
                               "solution": "So $x=\\boxed{\\frac{1}{2}}$."},
      "train/geometry/7.json": {"problem": "Area?", "level": "Level 5", "type": "Geometry",
                                "solution": "First \\boxed{3}, then $\\boxed{\\sqrt{2}}$."},
      "test/algebra/3.json": {"problem": "1+1?", "level": "Level ?", "type": "Algebra",
                              "solution": "$\\boxed{2}$"}}
  for rel, rec in probs.items():
    p = tmp_path / "MATH" / rel
    os.makedirs(p.parent, exist_ok=True)
    p.write_text(json.dumps(rec))
  out = tmp_path / "math"
  assert cli("math", str(tmp_path / "MATH"), "--out", str(out)) == 0
  train = read_jsonl(out / "train.jsonl")
  assert [(r["answer"], r["level"], r["subject"]) for r in train] == [
      ("\\frac{1}{2}", 2, "Algebra"), ("\\sqrt{2}", 5, "Geometry")]  # the last box
  assert read_jsonl(out / "test.jsonl")[0]["level"] == 0
  # HuggingFaceH4/MATH-500: test.jsonl with an answer field, int levels and subjects.
  m500 = write_jsonl(tmp_path / "MATH-500" / "test.jsonl", [
      {"problem": "Compute $\\dbinom{4}{2}$.", "solution": "It is $\\boxed{6}$.", "answer": "6",
       "subject": "Counting & Probability", "level": 2, "unique_id": "test/cp/1.json"}])
  assert cli("math500", m500, "--out", str(tmp_path / "m500")) == 0
  data = math_data.load_task("math", {"train": str(out / "train.jsonl"),
                                      "test": str(tmp_path / "m500" / "test.jsonl")})
  assert [r["answer"] for r in data["train"]] == ["\\frac{1}{2}", "\\sqrt{2}"]
  assert data["test"][0]["subject"] == "Counting & Probability"
  assert data["test"][0]["difficulty"] == 2
  # A prepared directory as a task_spec path: the manifests beside the records are skipped.
  assert len(math_data.load_math(str(tmp_path / "m500"))) == 1


def test_aime_layouts(tmp_path):
  # HuggingFaceH4/aime_2024 (answer text) and an AIME 2025 export with question / int answer.
  a24 = write_parquet(tmp_path / "aime_2024" / "data" / "train-00000-of-00001.parquet", [
      {"id": 60, "problem": "Find $m+n$.", "solution": "...", "answer": "204",
       "url": "https://example.invalid", "year": "2024"}])
  a25 = write_jsonl(tmp_path / "aime2025.jsonl", [{"question": "Find $k$.", "answer": 70}])
  assert cli("aime", a24, "--split", "test", "--out", str(tmp_path / "a24")) == 0
  assert cli("aime", a25, "--out", str(tmp_path / "a25")) == 0
  assert read_jsonl(tmp_path / "a24" / "test.jsonl")[0]["answer"] == "204"
  rec = read_jsonl(tmp_path / "a25" / "test.jsonl")[0]
  assert (rec["problem"], rec["answer"]) == ("Find $k$.", "70")


def test_dapo_math_17k_strips_the_instruction_and_drops_repeats(tmp_path):
  def wrap(problem):
    return f"{convert.DAPO_PREFIX}\n\n{problem}\n\n{convert.DAPO_SUFFIX}"

  # BytedTsinghua-SIA/DAPO-Math-17k: data/dapo-math-17k.parquet, each problem repeated.
  src = write_parquet(tmp_path / "data" / "dapo-math-17k.parquet", [
      verl_row(wrap("Let $x^2=4$, $x>0$. Find $x$."), "2", source="math_dapo", index="a"),
      verl_row(wrap("Find the sum $1+2+3$."), "6", source="math_dapo", index="b"),
      verl_row(wrap("Let $x^2=4$, $x>0$. Find $x$."), "2", source="math_dapo", index="c")])
  out = tmp_path / "dapo"
  manifests = convert.prepare("dapo_math_17k", [src], str(out), log=lambda s: None)
  recs = read_jsonl(out / "train.jsonl")
  assert [r["problem"] for r in recs] == ["Let $x^2=4$, $x>0$. Find $x$.",
                                          "Find the sum $1+2+3$."]
  assert [r["answer"] for r in recs] == ["2", "6"] and recs[0]["subject"] == "math_dapo"
  m = json.loads((out / "train.manifest.json").read_text())
  assert m == manifests["train"]
  assert m["records"] == 2 and m["dropped"] == {"repeated problem (the first kept)": 1}
  assert m["sources"][0]["rows"] == 3
  assert m["sources"][0]["sha256"] == hashlib.sha256(open(src, "rb").read()).hexdigest()
  assert m["sha256"] == hashlib.sha256((out / "train.jsonl").read_bytes()).hexdigest()
  assert m["fields"] == ["problem", "answer", "solution", "level", "subject", "source"]
  # Kept when asked; and a prompt without DAPO's instruction is named.
  convert.prepare("dapo_math_17k", [src], str(tmp_path / "all"), dedupe=False, log=print)
  assert len(read_jsonl(tmp_path / "all" / "train.jsonl")) == 3
  bad = write_parquet(tmp_path / "bad" / "dapo.parquet", [verl_row("What is 1+1?", "2")])
  with pytest.raises(convert.ConvertError, match=r"dapo.parquet row 0: the prompt is not in "
                     "DAPO-Math-17K's instruction"):
    convert.prepare("dapo_math_17k", [bad], str(tmp_path / "bad_out"), log=print)
  assert not os.path.exists(tmp_path / "bad_out")


def test_dars_and_verl_parquet(tmp_path):
  system = "Please reason step by step, and put your final answer within \\boxed{}."
  # DARS-Dataset: openr1.parquet (train) and capacity_val.parquet (test), verl's layout.
  d = tmp_path / "DARS-Dataset"
  write_parquet(d / "openr1.parquet", [
      verl_row("What is $3\\cdot 4$?", "12", system=system, target="$3\\cdot4=\\boxed{12}$"),
      verl_row("Simplify $\\frac{6}{8}$.", "\\frac{3}{4}", system=system)])
  write_parquet(d / "capacity_val.parquet", [verl_row("Find $2^5$.", ["32"], source="aime")])
  out = tmp_path / "dars"
  assert cli("dars", str(d), "--out", str(out)) == 0
  train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
  assert [r["answer"] for r in train] == ["12", "\\frac{3}{4}"]
  assert train[0]["system"] == system and train[0]["solution"] == "$3\\cdot4=\\boxed{12}$"
  assert test == [{"problem": "Find $2^5$.", "answer": "32", "solution": "", "level": 0,
                   "subject": "aime", "source": "capacity_val.parquet:0"}]
  data = math_data.load_task("math", {"train": str(out / "train.jsonl"),
                                      "test": str(out / "test.jsonl")})
  assert answer_check.score_math("so \\boxed{0.75}", data["train"][1]["answer"]) == 1.0
  # Any verl-style file, the split from its name.
  v = write_parquet(tmp_path / "verl" / "test.parquet", [verl_row("2+2?", 4)])
  assert cli("verl", v, "--out", str(tmp_path / "v")) == 0
  assert read_jsonl(tmp_path / "v" / "test.jsonl")[0]["answer"] == "4"


@pytest.mark.parametrize("rows, message", [
    ([verl_row("1+1?", "2"), {"data_source": "x", "prompt": [{"content": "2+2?", "role": "user"}],
                              "reward_model": {"style": "rule"}}],
     r"bad.parquet row 1: field 'reward_model' has no 'ground_truth'"),
    ([verl_row("1+1?", ["2", "3"])], r"bad.parquet row 0: reward_model.ground_truth holds 2"),
    ([{"data_source": "x", "prompt": [{"content": "hi", "role": "system"}],
       "reward_model": {"ground_truth": "1"}}], r"bad.parquet row 0: field 'prompt' has no user"),
])
def test_bad_rows_are_named_and_nothing_is_written(tmp_path, capsys, rows, message):
  src = write_parquet(tmp_path / "src" / "train-bad.parquet", rows)
  os.rename(src, tmp_path / "src" / "bad.parquet")
  out = tmp_path / "out"
  assert cli("verl", str(tmp_path / "src" / "bad.parquet"), "--split", "train",
             "--out", str(out)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ")
  assert re.search(message, err[0]), err[0]
  assert not os.path.exists(out)


def test_refusals_before_any_work(tmp_path, capsys):
  rows = [{"question": "1+1?", "answer": "2\n#### 2"}]
  src = write_jsonl(tmp_path / "train.jsonl", rows)
  out = tmp_path / "out"
  assert cli("gsm8k", src, "--out", str(out)) == 0
  before = (out / "train.jsonl").read_bytes()
  capsys.readouterr()
  # Never overwritten, the existing file named.
  assert cli("gsm8k", src, "--out", str(out)) == 2
  assert "train.jsonl: exists already" in capsys.readouterr().err
  assert (out / "train.jsonl").read_bytes() == before
  # A split that cannot be told, a missing source, a bad converter, a file that is not parquet.
  other = write_jsonl(tmp_path / "gsm.jsonl", rows)
  assert cli("gsm8k", other, "--out", str(tmp_path / "o2")) == 2
  assert "gsm.jsonl: cannot tell its split" in capsys.readouterr().err
  assert cli("gsm8k", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o3")) == 2
  assert "missing.jsonl: does not exist" in capsys.readouterr().err
  assert cli("nope", src, "--out", str(tmp_path / "o4")) == 2
  assert "unknown converter 'nope'" in capsys.readouterr().err
  fake = tmp_path / "fake" / "train.parquet"
  os.makedirs(fake.parent)
  fake.write_text("not parquet")
  assert cli("verl", str(fake), "--out", str(tmp_path / "o5")) == 2
  assert "train.parquet: not a readable parquet file" in capsys.readouterr().err
  bad_json = tmp_path / "bj" / "train.jsonl"
  os.makedirs(bad_json.parent)
  bad_json.write_text(json.dumps(rows[0]) + "\n{oops\n")
  assert cli("gsm8k", str(bad_json), "--out", str(tmp_path / "o6")) == 2
  assert "train.jsonl:2: invalid JSON" in capsys.readouterr().err
  for o in ("o2", "o3", "o4", "o5", "o6"):
    assert not os.path.exists(tmp_path / o)


def test_command_line(tmp_path):
  src = write_jsonl(tmp_path / "test.jsonl", [{"problem": "x?", "answer": "1"}])
  r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), "aime",
                      src, "--out", str(tmp_path / "o")], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert "aime test: 1 records from 1 rows of 1 file(s)" in r.stdout
  r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), "aime",
                      src, "--out", str(tmp_path / "o")], capture_output=True, text=True)
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "exists already" in r.stderr
