"""Checking plain config values (JSON scalars, lists, dicts) against type annotations.

``matches(value, hint)`` is strict where JSON is ambiguous: a bool is not an int, a float is
not an int, an int is a float; ``describe(hint)`` says the type in words for an error message.
Used for recipe arguments (``rlpost.objectives.recipes``) and task specs
(``rlpost.tasks.base``). Imports nothing of rlpost's.
"""

from __future__ import annotations

import types
import typing
from typing import Any


def matches(value: Any, hint: Any) -> bool:
  """Whether ``value`` has type ``hint``: exact for bool and str, int for int (not bool), int
  or float for float, any arm of a Union / Optional, a member of a Literal, a list or tuple
  for a sequence, a dict for a dict; other hints accept anything."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union or origin is types.UnionType:
    return any(matches(value, a) for a in args)
  if origin is typing.Literal:
    return value in args
  if hint is type(None):
    return value is None
  if hint is bool:
    return isinstance(value, bool)
  if hint is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if hint is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if hint is str:
    return isinstance(value, str)
  if origin in (tuple, list):
    return isinstance(value, (tuple, list))
  if origin is dict or hint is dict:
    return isinstance(value, dict)
  return True


def describe(hint: Any) -> str:
  """``hint`` in words: "a number or None", "an integer", "a string", ..."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union or origin is types.UnionType:
    return " or ".join(describe(a) for a in args)
  if origin is typing.Literal:
    return "one of " + ", ".join(repr(a) for a in args)
  names = {type(None): "None", bool: "true or false", int: "an integer", float: "a number",
           str: "a string", dict: "a dict"}
  if hint in names:
    return names[hint]
  if origin in (tuple, list):
    return "a list"
  return getattr(hint, "__name__", str(hint))
