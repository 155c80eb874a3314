"""Name registries that tolerate re-import.

Recipes, tasks and allocation rules register under a name when their module is imported. A module
imported again (``importlib.reload``, a notebook cell run twice, a config file executed twice)
registers new objects of the same origin, its module and qualified name: they replace the old
entry. Another object under a taken name is refused, so two extensions cannot shadow each other.
Origin is a name, not an identity: two lambdas of one module share ``<lambda>``, and a
``functools.partial`` counts as the function it wraps, so register named functions.
"""

from __future__ import annotations

import inspect

# Run facts that a registered function may take under an earlier name: {earlier: current}.
RENAMED_FACTS = {"stop_ids": "stop_tokens"}


def origin(obj) -> str:
  """``module.qualname`` of a function or class (of the wrapped function of a partial)."""
  obj = getattr(obj, "func", obj)
  return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def add(registry: dict, name: str, obj, *, what: str, key=lambda x: x) -> None:
  """``registry[name] = obj``, unless ``name`` holds an entry of another origin (``key``
  picks the registered function or class out of an entry): then ValueError."""
  old = registry.get(name)
  if old is not None and origin(key(old)) != origin(key(obj)):
    raise ValueError(f"{what} {name!r} is already registered (by {origin(key(old))}); "
                     f"{origin(key(obj))} cannot take its name")
  registry[name] = obj


def facts_for(fn, facts: dict) -> dict:
  """The entries of ``facts`` that ``fn`` takes as keyword arguments; a renamed fact
  (``RENAMED_FACTS``) also reaches an argument of its earlier name."""
  params = inspect.signature(fn).parameters
  named = dict(facts, **{old: facts[new] for old, new in RENAMED_FACTS.items() if new in facts})
  return {k: v for k, v in named.items() if k in params}


def moved(module: str, names: dict):
  """A module ``__getattr__`` for names that moved: each of ``names`` raises AttributeError
  saying where it went ({name: new place}); any other name the usual AttributeError."""
  def __getattr__(name: str):
    if name in names:
      raise AttributeError(f"{module}.{name} moved to {names[name]}")
    raise AttributeError(f"module {module!r} has no attribute {name!r}")

  return __getattr__
