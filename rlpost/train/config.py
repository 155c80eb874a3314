"""Strict, typed run configs built from dicts and ``key=value`` overrides.

A config is a frozen dataclass of plain values. ``from_dict`` rejects unknown keys (naming them
and listing the known ones) and values of the wrong type, and each config's ``validate`` rejects
impossible values with the key in the message, so a bad run fails at start, not hours in.

Each key is declared once, with ``key(default, group, help=...)``: its group (the section of
``--help``), its help line, and two flags read by the code that compares configs: ``run_local``
(runs of one arm may differ in it: where files live, how the run is laid out on devices and in
memory, operational settings) and ``operational`` (a resumed run may change it without it
counting as a config change). ``help_of``, ``keys_where`` and ``describe`` read them back.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import typing
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


def key(default: Any = dataclasses.MISSING, group: str = "", *, help: str,
        run_local: bool = False, operational: bool = False, factory: Any = None):
  """A config field with its metadata (see the module docstring); ``factory`` makes a fresh
  default per config (``dict``, ``list``)."""
  if not help or "\n" in help:
    raise ValueError(f"a config key needs one line of help, got {help!r}")
  meta = dict(group=group, help=help, run_local=run_local, operational=operational)
  if factory is not None:
    return dataclasses.field(default_factory=factory, metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def help_of(cls: type) -> dict[str, str]:
  """{key: help line} of the config dataclass ``cls``, in field order."""
  return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def keys_where(cls: type, **flags: bool) -> frozenset:
  """The keys of ``cls`` whose metadata has every flag given, e.g. ``run_local=True``."""
  return frozenset(f.name for f in dataclasses.fields(cls)
                   if all(bool(f.metadata.get(k, False)) == v for k, v in flags.items()))


def _coerce(name: str, value: Any, typ: Any) -> Any:
  origin = typing.get_origin(typ)
  args = typing.get_args(typ)
  if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
    if value is None and type(None) in args:
      return None
    errors = []
    for a in args:
      if a is type(None):
        continue
      try:
        return _coerce(name, value, a)
      except (TypeError, ValueError) as e:
        errors.append(str(e))
    raise TypeError(f"config key {name!r}: {value!r} matches none of {typ}")
  if typ is bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
      return value.lower() in ("true", "1")
    raise TypeError(f"config key {name!r} must be a bool, got {value!r}")
  if typ is int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
      raise TypeError(f"config key {name!r} must be an int, got {value!r}")
    try:
      return int(value)
    except ValueError:
      raise TypeError(f"config key {name!r} must be an int, got {value!r}") from None
  if typ is float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
      raise TypeError(f"config key {name!r} must be a float, got {value!r}")
    try:
      return float(value)
    except ValueError:
      raise TypeError(f"config key {name!r} must be a float, got {value!r}") from None
  if typ is str:
    if not isinstance(value, str):
      raise TypeError(f"config key {name!r} must be a string, got {value!r}")
    return value
  if origin is dict or typ is dict:
    if isinstance(value, str):
      value = _parse_literal(name, value)
    if not isinstance(value, dict):
      raise TypeError(f"config key {name!r} must be a dict, got {value!r}")
    return dict(value)
  if origin is tuple or typ is tuple:
    if isinstance(value, str):
      value = _parse_literal(name, value)
    if not isinstance(value, (list, tuple)):
      raise TypeError(f"config key {name!r} must be a sequence, got {value!r}")
    inner = args[0] if args else Any
    return tuple(v if inner is Any else _coerce(name, v, inner) for v in value)
  return value


def _parse_literal(name: str, text: str) -> Any:
  """JSON, or a Python literal (``ast.literal_eval`` only parses literals; nothing executes)."""
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    pass
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise TypeError(f"config key {name!r}: cannot parse {text!r} as a literal") from None


def from_dict(cls: type[T], values: dict, *, where: str = "config", validate: bool = True) -> T:
  """Build dataclass ``cls`` from ``values``; unknown keys and wrong types raise ValueError, and
  so does the config's own ``validate`` (when ``validate``: it may depend on this machine, e.g.
  its devices)."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  if hasattr(cls, "upgrade"):  # older spellings of keys, rewritten (e.g. ``RLConfig.upgrade``)
    values = cls.upgrade(dict(values))
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f"unknown {where} key(s) {unknown}; known keys: {sorted(fields)}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for k, v in values.items():
    try:
      kwargs[k] = _coerce(k, v, hints[k])
    except TypeError as e:
      raise ValueError(f"{where}: {e}") from None
  cfg = cls(**kwargs)
  if validate and hasattr(cfg, "validate"):
    cfg.validate()
  return cfg


def _unescape(text: str) -> str:
  r"""``\n``, ``\t`` and ``\\`` as a shell passes them (two characters) -> the characters."""
  return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def parse_overrides(items: Sequence[str], cls: type | None = None) -> dict:
  r"""``["lr=1e-4", "recipe=dapo"]`` -> {"lr": "1e-4", "recipe": "dapo"} (typed by from_dict).

  With ``cls`` (the config dataclass), a string-typed key's value may be ``@path`` (the file's
  text, one trailing newline dropped: for templates), and ``\n``, ``\t`` and ``\\`` typed on
  a command line become a newline, a tab and a backslash.
  """
  hints = typing.get_type_hints(cls) if cls is not None else {}
  out = {}
  for item in items:
    if "=" not in item:
      raise ValueError(f"override {item!r} is not of the form key=value")
    k, v = item.split("=", 1)
    k, v = k.strip(), v.strip()
    hint = hints.get(k)
    if hint is str or (hint is not None and str in typing.get_args(hint)):
      if v.startswith("@"):
        try:
          with open(v[1:]) as f:
            v = f.read()
        except OSError as e:
          raise ValueError(f"override {k}: cannot read {v[1:]!r}: {e.strerror}") from None
        v = v[:-1] if v.endswith("\n") else v
      else:
        v = _unescape(v)
    out[k] = v
  return out


def apply_overrides(values: dict, overrides: dict) -> dict:
  """``values`` updated with ``overrides`` (``parse_overrides``): ``key=value`` replaces a key,
  ``key.field=value`` sets one field of a dict-valued key (``recipe_args.alpha=0.5``,
  ``allocation_args.chunk=16``, ``model.max_seq_len=8192``) and keeps its other fields. A
  field's value is read as JSON (numbers, true / false, lists, dicts), else kept as text.
  ValueError naming the override for a dotted key whose head does not hold a dict."""
  out = dict(values)
  for k, v in overrides.items():
    if "." not in k:
      out[k] = v
      continue
    head, field = k.split(".", 1)
    base = out.get(head, {})
    if isinstance(base, str):  # a whole-dict override given earlier, as JSON or a literal
      try:
        base = _parse_literal(head, base)
      except TypeError:
        pass
    if not isinstance(base, dict) or not field or "." in field:
      raise ValueError(f"override {k}={v}: {head!r} does not hold a dict of fields (a dotted "
                       "override sets one field of recipe_args, allocation_args, model, ...)")
    if isinstance(v, str):
      try:
        v = json.loads(v)
      except ValueError:
        pass
    out[head] = dict(base, **{field: v})
  return out


def describe(cls: type, help: dict[str, str] | None = None) -> str:
  """Every key of dataclass ``cls`` as ``key (type, default: value)`` and its help line (from
  ``help`` or the field's metadata), under its group's heading in the order the groups first
  appear, in field order within a group (the text of ``scripts/train.py --help``)."""
  hints = typing.get_type_hints(cls)
  help = help_of(cls) if help is None else help
  groups: dict[str, list] = {}
  for f in dataclasses.fields(cls):
    groups.setdefault(f.metadata.get("group", ""), []).append(f)
  lines = []
  for group, fields in groups.items():
    if group:
      lines.append(f"{group}:")
    lines += [_describe_field(f, hints, help) for f in fields]
  return "\n".join(lines)


def _describe_field(f, hints: dict, help: dict) -> str:
  if f.default is not dataclasses.MISSING:
    default = f.default
  elif f.default_factory is not dataclasses.MISSING:
    default = f.default_factory()
  else:
    default = "required"
  typ = getattr(hints[f.name], "__name__", None) or str(hints[f.name]).replace("typing.", "")
  shown = repr(default)
  if len(shown) > 40:
    shown = shown[:37] + "..."
  return f"  {f.name} ({typ}, default {shown})\n      {help.get(f.name, '')}"


def to_dict(cfg) -> dict:
  return dataclasses.asdict(cfg)
