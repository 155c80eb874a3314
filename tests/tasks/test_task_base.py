"""The Task registry, the one padder, and the host scorer built from a task."""

import numpy as np
import pytest

from rlpost.tasks import base
from rlpost.tasks.tokenizer import EOS, CharTokenizer, pad


def test_registry_lists_builtins_and_refuses_unknown_or_duplicate_names():
  assert {"arithmetic", "countdown", "gsm8k", "math"} <= set(base.list_tasks())
  with pytest.raises(ValueError, match=r"unknown task 'nope'; known: \['arithmetic'"):
    base.get_task("nope")

  class Other(base.Task):
    name = "arithmetic"

  with pytest.raises(ValueError, match="task 'arithmetic' is already registered"):
    base.register_task(Other)

  class Nameless(base.Task):
    pass

  with pytest.raises(ValueError, match="Nameless has no name"):
    base.register_task(Nameless)

  class Unscored(base.Task):
    name = "unscored-test"

    def load(self, log):
      return {}

  with pytest.raises(ValueError, match="'unscored-test' .Unscored. does not implement score"):
    base.register_task(Unscored)
  with pytest.raises(TypeError, match="abstract"):
    Unscored(cfg=None)


def test_pad_left_right_and_errors():
  toks, mask = pad([[5, 6], [7]], pad_id=9, side="left")
  np.testing.assert_array_equal(toks, [[5, 6], [9, 7]])
  np.testing.assert_array_equal(mask, [[True, True], [False, True]])
  toks, mask = pad([[5, 6], [7]], pad_id=9, side="right", length=3)
  np.testing.assert_array_equal(toks, [[5, 6, 9], [7, 9, 9]])
  assert toks.dtype == np.int32 and mask.dtype == bool
  with pytest.raises(ValueError, match="row 1 has 3 tokens and does not fit the buffer length 2"):
    pad([[1], [1, 2, 3]], pad_id=0, length=2, what="row")
  with pytest.raises(ValueError, match="prompt 0 is empty"):
    pad([[]], pad_id=0, what="prompt", allow_empty=False)
  with pytest.raises(ValueError, match="empty batch"):
    pad([], pad_id=0)


def test_host_scorer_decodes_and_passes_finished_and_the_record():
  seen = []

  class Echo(base.Task):
    name = "echo-test"

    def load(self, log):
      return {}

    def score(self, completion, finished, record):
      seen.append((completion, finished, record["answer"]))
      return float(finished and completion == record["answer"])

  tok = CharTokenizer()
  records = {"train": [{"answer": "12"}, {"answer": "3"}], "test": [{"answer": "7"}]}
  fn = base.host_scorer(Echo(cfg=None), records, tok, stop_ids=(EOS,))
  ids = [tok.encode("12", eos=True), tok.encode("3"), tok.encode("7", eos=True)]
  tokens, mask = pad(ids, pad_id=tok.pad_id, side="right")
  r = fn(tokens[:2], mask[:2], np.array([0, 1]), 0)
  assert list(r) == [1.0, 0.0] and r.dtype == np.float32
  assert seen == [("12", True, "12"), ("3", False, "3")]
  assert list(fn(tokens[2:], mask[2:], np.array([0]), 1)) == [1.0]  # split 1: test records
