"""The ``Task`` interface of the RL trainer, its registry, and task arrays on device.

A task is a set of records per split and a verifier. The trainer never names a task: it asks
the task catalog for ``catalog.get_task(cfg.task)`` (``rlpost.tasks.catalog``) and uses only
this interface.

Records are dicts with at least ``prompt`` (text), ``answer`` (text) and ``difficulty`` (int:
the band per-difficulty metrics are reported by); tasks that warm-start the built-in character
model also give ``demo`` (a worked solution, the SFT target).

A task scores completions in one of two ways:

* ``score(completion, finished, record) -> float`` on the host, for any tokenizer: the trainer
  calls it through one batched callback per sampling call (``host_reward``);
* optionally in JAX, for the character tokenizer only: ``answer_arrays`` encodes each record's
  answer once, and ``jax_reward(tokens, mask, answer, answer_len, tok)`` scores on device.

A reward >= ``task.correct_at`` (1 unless the task says otherwise) counts as correct. Adding a
task is one file with a ``Task`` subclass and a ``register_task`` call, plus its test; see README
"Extending rlpost".

Shape legend: N records of a split, Tp prompt buffer, A answer buffer, B rows, T tokens.
"""

from __future__ import annotations

import abc
import dataclasses
import typing
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlpost import registry, typecheck
from rlpost.tokenizer import Tokenizer, pad

SPLITS = ("train", "test")


class TaskArrays(NamedTuple):
  """A split on device: prompts left-padded [N, Tp] int32 / bool, answers right-padded [N, A]
  int32 with lengths [N] int32 (zeros for host-scored tasks), difficulty bands [N] int32."""

  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  answer: jax.Array
  answer_len: jax.Array
  difficulty: jax.Array


class Task(abc.ABC):
  """A verifiable task (see the module docstring). Subclasses set ``name`` and implement
  ``load`` and ``score``; the rest has defaults.

  Attributes:
    name: registry name (``cfg.task``).
    character_alphabet: prompts and answers fit the built-in character tokenizer (False for real
      text: the task then needs a Hugging Face ``policy``).
    takes_prompt_template: the trainer formats prompts with the template text
      ``cfg.prompt_template`` (a policy's chat format) instead of using them as they are.
    has_graded_reward: ``cfg.graded_reward`` (partial credit) applies.
    reads_files: every value of ``cfg.task_spec`` is a local path or a list of them (the data
      a run's identity digests, ``rlpost.train.identity``); False: the data follows from the
      config.
  """

  name: str = ""
  character_alphabet: bool = True
  takes_prompt_template: bool = False
  has_graded_reward: bool = False
  reads_files: bool = False

  @property
  def correct_at(self) -> float:
    """The reward from which a completion counts as correct (accuracy, pass@k)."""
    return 1.0

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    # A boolean ``prompt_template`` (the config key's name) is read by nothing: the subclass
    # would silently lose its template.
    if isinstance(cls.__dict__.get("prompt_template"), bool):
      raise TypeError(f"task {cls.__name__}: the flag 'prompt_template' is now "
                      "'takes_prompt_template'")

  def __init__(self, cfg: Any):
    """``cfg`` is the run's RLConfig; a task reads its own keys (``task_spec``, sizes...)."""
    self.cfg = cfg

  @classmethod
  def validate(cls, cfg: Any) -> None:
    """Task-specific config checks, before any work; raise ValueError naming the key."""

  @abc.abstractmethod
  def load(self, log: Callable[[str], None]) -> dict[str, list[dict]]:
    """{"train": records, "test": records}."""

  @abc.abstractmethod
  def score(self, completion: str, finished: bool, record: dict) -> float:
    """The reward of a decoded completion (``finished``: a stop token was emitted)."""

  def score_batch(self, completions: Sequence[str], finished: Sequence[bool],
                  records: Sequence[dict]) -> Sequence[float]:
    """The rewards of a batch of decoded completions, one ``score`` each unless a task scores
    a batch at once (e.g. in worker processes); the host callback calls this."""
    return [self.score(c, f, r) for c, f, r in zip(completions, finished, records)]

  def final_answer(self, completion: str) -> str | None:
    """The answer a completion votes for in maj@k (None: no answer)."""
    return completion.split(",")[-1] or None

  def reference_answer(self, record: dict) -> str | None:
    """A record's answer in the form ``final_answer`` returns."""
    return record["answer"]

  # Optional in-JAX reward for the character tokenizer; None: scored on the host.
  jax_reward: Callable | None = None

  def answer_arrays(self, records: Sequence[dict], tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Answers for ``jax_reward`` on character ids: ([N, A] int32, [N] int32)."""
    raise NotImplementedError(f"task {self.name!r} has no in-JAX reward")


_REGISTRY: dict[str, type[Task]] = {}


def register_task(task: type[Task]) -> type[Task]:
  """Adds a ``Task`` subclass under ``task.name`` (usable as a class decorator). A class of the
  same module and qualified name replaces the entry (a re-imported module); another class under
  a registered name raises ValueError (``rlpost.registry``)."""
  if not task.name:
    raise ValueError(f"{task.__name__} has no name")
  if task.name in _REGISTRY:
    registry.add({task.name: _REGISTRY[task.name]}, task.name, task, what="task")
  missing = sorted(getattr(task, "__abstractmethods__", ()))
  if missing:
    raise ValueError(f"task {task.name!r} ({task.__name__}) does not implement "
                     f"{', '.join(missing)}")
  _REGISTRY[task.name] = task
  return task


def registered() -> dict[str, type[Task]]:
  """{name: task class} of the tasks registered so far (``rlpost.tasks.catalog`` imports the
  built-in ones first and looks names up)."""
  return dict(_REGISTRY)


__getattr__ = registry.moved(__name__, {"get_task": "rlpost.tasks.catalog.get_task",
                                         "list_tasks": "rlpost.tasks.catalog.list_tasks"})


def format_prompt(template: str, question: str) -> str:
  """``template`` with every literal ``{question}`` replaced by ``question``.

  Plain substitution: no other braces are interpreted (``\\boxed{}`` stays as written) and
  nothing in the template or the question is evaluated.
  """
  return template.replace("{question}", question)


def task_arrays(records: Sequence[dict], prompt_ids: Sequence[Sequence[int]], *, pad_id: int,
                length: int, answers: tuple[np.ndarray, np.ndarray] | None = None) -> TaskArrays:
  """A split's arrays: prompt ids left-padded with ``pad_id`` to [N, length]; ``answers`` from
  ``Task.answer_arrays`` for an in-JAX reward (else [N, 1] zeros)."""
  pt, pm = pad(prompt_ids, pad_id=pad_id, length=length, side="left", what="prompt")
  n = len(records)
  ans, ans_len = answers if answers is not None else (np.zeros((n, 1), np.int32),
                                                        np.zeros((n,), np.int32))
  return TaskArrays(jnp.asarray(pt), jnp.asarray(pm), jnp.asarray(ans), jnp.asarray(ans_len),
                    jnp.asarray([r["difficulty"] for r in records], jnp.int32))


def host_scorer(task: Task, records: dict[str, list[dict]], tok: Tokenizer,
                stop_tokens: Sequence[int]) -> Callable:
  """``fn(tokens [B, N], mask [B, N], idx [B], split_id) -> [B] float32`` scoring decoded
  completions of prompts ``idx`` of split ``SPLITS[split_id]`` with ``task.score_batch``."""
  stop = np.asarray(list(stop_tokens))

  def fn(tokens: np.ndarray, mask: np.ndarray, idx: np.ndarray, split: int) -> np.ndarray:
    split_records = records[SPLITS[split]]
    texts = [tok.decode(t[m]) for t, m in zip(tokens, mask)]
    finished = [bool(np.any(np.isin(t, stop) & m)) for t, m in zip(tokens, mask)]
    scores = task.score_batch(texts, finished, [split_records[int(i)] for i in idx])
    return np.asarray(scores, np.float32).reshape(len(idx))

  return fn


def host_reward(fn, tokens, mask, idx, *, split_id: int, correct_at: float = 1.0):
  """Score completions on the host through one batched callback (the only host boundary).

  fn(tokens [B, N] np.int32, mask [B, N] np.bool_, idx [B] np.int32, split) -> [B] float32.
  Returns (rewards [B] float32, correct [B] bool = reward >= correct_at).
  """
  shape = jax.ShapeDtypeStruct(idx.shape, jnp.float32)

  def checked(t, m, i):
    # Host arrays before any Python iteration: the operands may arrive as jax.Arrays, and an
    # op on them would dispatch a program to a device that is waiting for this callback (on
    # several CPU devices, a deadlock in the next collective).
    t, m, i = np.asarray(t), np.asarray(m), np.asarray(i)
    try:
      r = np.asarray(fn(t, m, i, split_id), np.float32)
    except Exception as e:  # noqa: BLE001 - re-raised with the batch context
      raise RuntimeError(f"reward function failed on a batch of {len(i)} rollouts "
                         f"(prompts {int(i.min())}..{int(i.max())}): {e!r}") from e
    if r.shape != i.shape:
      raise ValueError(f"reward function returned shape {r.shape}, expected {i.shape}")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
      raise ValueError(f"reward function returned {r[bad[0]]} for rollout {int(bad[0])} "
                       f"(prompt {int(i[bad[0]])})")
    return r

  r = jax.pure_callback(checked, shape, tokens, mask, idx, vmap_method="sequential")
  return r, r >= correct_at


def check_spec(task: str, spec_class: type, spec: Any) -> None:
  """Checks a task's ``task_spec`` against its spec dataclass ``spec_class``: a dict, no unknown
  fields (the known ones listed), each value of its field's type, and the values the dataclass
  accepts (its ``__post_init__``). Raises ValueError naming config key 'task_spec' and the
  field."""
  head = f"config key 'task_spec' (task {task!r})"
  if not isinstance(spec, dict):
    raise ValueError(f"{head}: must be a dict of fields, got {spec!r}")
  fields = [f.name for f in dataclasses.fields(spec_class)]
  unknown = sorted(set(spec) - set(fields))
  if unknown:
    raise ValueError(f"{head}: unknown field(s) {unknown}; known: {fields}")
  hints = typing.get_type_hints(spec_class)
  for name, value in spec.items():
    hint = hints.get(name)
    if hint is not None and not typecheck.matches(value, hint):
      raise ValueError(f"{head}: field {name!r} must be {typecheck.describe(hint)}, got "
                       f"{value!r}")
  try:
    spec_class(**spec)
  except ValueError as e:
    raise ValueError(f"{head}: {e}") from None
