"""The Task registry, the one padder, and the host scorer built from a task."""

import numpy as np
import pytest

from rlpost.tasks import base, catalog
from rlpost.tokenizer import EOS, CharTokenizer, pad


def test_registry_lists_builtins_and_refuses_unknown_or_duplicate_names():
  assert {"arithmetic", "countdown", "gsm8k", "math"} <= set(catalog.list_tasks())
  with pytest.raises(ValueError, match=r"unknown task 'nope'; known: \['arithmetic'"):
    catalog.get_task("nope")

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


def test_the_template_flag_is_apart_from_the_config_template():
  # the Task flag says whether prompts take the config's template text (cfg.prompt_template)
  assert not base.Task.takes_prompt_template
  assert catalog.get_task("gsm8k").takes_prompt_template
  assert not catalog.get_task("arithmetic").takes_prompt_template
  with pytest.raises(TypeError, match="'prompt_template' is now 'takes_prompt_template'"):

    class Old(base.Task):  # noqa: F841
      prompt_template = True


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
  fn = base.host_scorer(Echo(cfg=None), records, tok, stop_tokens=(EOS,))
  ids = [tok.encode("12", eos=True), tok.encode("3"), tok.encode("7", eos=True)]
  tokens, mask = pad(ids, pad_id=tok.pad_id, side="right")
  r = fn(tokens[:2], mask[:2], np.array([0, 1]), 0)
  assert list(r) == [1.0, 0.0] and r.dtype == np.float32
  assert seen == [("12", True, "12"), ("3", False, "3")]
  assert list(fn(tokens[2:], mask[2:], np.array([0]), 1)) == [1.0]  # split 1: test records


def test_host_reward_on_a_mesh_iterates_host_arrays(with_devices):
  """The scorer iterates its rows in Python. On 8 CPU devices the callback runs while the
  devices wait for it, so an op it dispatched on a jax.Array would never run (the next
  collective aborts after 40 s); host_reward hands it NumPy arrays."""
  out = with_devices("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from rlpost.tasks.base import host_reward

    seen = []
    def fn(tokens, mask, idx, split):
      seen.append(type(tokens).__module__)
      return np.asarray([float(sum(int(x) for x in t[m])) for t, m in zip(tokens, mask)])

    @jax.jit
    def total(t, m, i):
      r, c = host_reward(fn, t, m, i, split_id=0)
      return jnp.sum(r), jnp.sum(c)

    rows = NamedSharding(jax.make_mesh((8,), ("d",)), P("d"))
    t = jax.device_put(jnp.arange(64, dtype=jnp.int32).reshape(16, 4), rows)
    m = jax.device_put(jnp.ones((16, 4), bool), rows)
    i = jax.device_put(jnp.arange(16, dtype=jnp.int32), rows)
    s, c = total(t, m, i)
    print(float(s), int(c), seen)
  """)
  s, c, seen = out.strip().split(" ", 2)
  assert float(s) == sum(range(64)) and int(c) == 16 and "numpy" in seen


def test_moved_lookups_name_their_new_place():
  from rlpost.tasks import builders

  with pytest.raises(AttributeError, match="moved to rlpost.tasks.catalog.get_task"):
    base.get_task("arithmetic")
  with pytest.raises(AttributeError, match="moved to rlpost.tasks.catalog.build"):
    builders.build("arithmetic")
  with pytest.raises(AttributeError, match="has no attribute 'nope'"):
    base.nope  # noqa: B018
