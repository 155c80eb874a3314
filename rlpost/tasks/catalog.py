"""Every registered task by name: the built-in tasks and any task a module registered.

The top of the tasks package: it imports the built-in task modules (each registers its classes
with ``base.register_task`` when imported) and looks names up in the registry. A user's task
registers the same way and is found once its module is imported. Nothing below this module
imports it, so the task modules and the registry form no import circle.
"""

from __future__ import annotations

from typing import Callable

from rlpost.tasks import arithmetic, base, builders, countdown, math_data

BUILTIN = (arithmetic, countdown, math_data)  # the modules whose import registers the built-ins


def list_tasks() -> tuple[str, ...]:
  """Registered task names, sorted."""
  return tuple(sorted(base.registered()))


def get_task(name: str) -> type[base.Task]:
  """The task class registered as ``name``; ValueError listing the known ones."""
  tasks = base.registered()
  if name not in tasks:
    raise ValueError(f"unknown task {name!r}; known: {list(list_tasks())}")
  return tasks[name]


def synthetic_tasks() -> tuple[str, ...]:
  """The names of the registered synthetic tasks, sorted."""
  return tuple(n for n in list_tasks() if issubclass(get_task(n), builders.SyntheticTask))


def build(task: str, *, spec: dict | None = None, num_train: int = 10000, num_test: int = 1000,
          seed: int = 0, data_dir: str | None = None, log: Callable[[str], None] = print
          ) -> dict[str, list[dict]]:
  """Build (once) and read the synthetic task registered as ``task``: {"train": [...], "test":
  [...]} of record dicts (``builders.build_task``); building logs one line through ``log``."""
  known = synthetic_tasks()
  if task not in known:
    raise ValueError(f"unknown task {task!r}; known: {list(known)}")
  return builders.build_task(get_task(task), spec=spec, num_train=num_train, num_test=num_test,
                             seed=seed, data_dir=data_dir, log=log)
