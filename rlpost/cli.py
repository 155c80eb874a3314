"""Command-line entry points: a user error is one line on stderr and exit status 2.

Every script under ``scripts/`` ends with ``run_main(main)``. A user error (a bad config key or
value, a missing or unreadable file, a corrupt checkpoint, a run directory that is a file, ...)
prints ``error: <message>`` on one line and exits with status 2; Ctrl-C prints
``error: interrupted`` and exits with status 130. Anything else is a bug and keeps Python's
traceback (exit status 1).

A message longer than ``MAX_MESSAGE`` characters (an underlying library's error text, say) is
cut to that length at a word boundary and ends with ``MORE``, a pointer to ``--debug``.

The traceback of a user error is shown too with ``--debug`` on the command line (removed before
the script's own parser sees it) or ``RLPOST_DEBUG=1`` in the environment, and the message is
then printed in full; the exit status stays 2.

``main`` itself raises as usual, so tests and other Python callers call it directly with an
argv list and see the exceptions.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, NoReturn, Sequence

DEBUG_FLAG = "--debug"
DEBUG_ENV = "RLPOST_DEBUG"
USAGE_STATUS = 2
INTERRUPT_STATUS = 130
MAX_MESSAGE = 300
MORE = " ... (--debug for the full message)"

# Exceptions that mean the input is wrong, not the code: the built-in ones, and the project's
# own by (module, class) name. The project's modules are looked up in ``sys.modules`` only: an
# exception of a class from a module that was never imported cannot have been raised, so
# classifying an error never imports anything.
_BUILTIN_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
                        IsADirectoryError, PermissionError, FloatingPointError)
_PROJECT_USER_ERRORS = (("rlpost.checkpoint_format", "CheckpointError"),
                        ("rlpost.train.guards", "TrainingStalled"),
                        ("rlpost.paths", "StorageError"),
                        ("rlpost.paths", "RunDirLocked"))


def user_error_types() -> tuple[type[BaseException], ...]:
  """The exception classes reported as one line (those of the project's loaded modules)."""
  out = list(_BUILTIN_USER_ERRORS)
  for module, name in _PROJECT_USER_ERRORS:
    cls = getattr(sys.modules.get(module), name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
      out.append(cls)
  return tuple(out)


def is_user_error(e: BaseException) -> bool:
  return isinstance(e, user_error_types())


def one_line(e: BaseException) -> str:
  """The exception's message on a single line.

  Newlines (and the whitespace around them) become single spaces; an empty message falls back to
  the exception's class name. OS errors keep their own text, which names the path
  (``[Errno 2] No such file or directory: 'x'``).
  """
  text = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
  return text or type(e).__name__


def full_text(e: BaseException) -> str:
  """The exception's whole message on one line: ``one_line``, but of an error's
  ``full_message`` where it has one (``CheckpointError``, whose ``str`` summarises the
  underlying error)."""
  full = getattr(e, "full_message", None)
  if isinstance(full, str) and full.strip():
    return " ".join(part.strip() for part in full.splitlines() if part.strip())
  return one_line(e)


def shorten(message: str, limit: int = MAX_MESSAGE) -> str:
  """``message`` if at most ``limit`` characters, else its start cut at a word boundary and
  ending with ``MORE`` (the result is at most ``limit`` characters)."""
  if len(message) <= limit:
    return message
  head = message[:limit - len(MORE)]
  space = head.rfind(" ")
  if space >= len(head) // 2:
    head = head[:space]
  return head.rstrip(" ,;:(") + MORE


def debug_requested(argv: Sequence[str]) -> bool:
  """``--debug`` among the options (before any ``--``), or ``RLPOST_DEBUG`` set to a true value."""
  env = os.environ.get(DEBUG_ENV, "").strip().lower()
  if env not in ("", "0", "false", "no", "off"):
    return True
  return DEBUG_FLAG in _options(argv)


def strip_debug_flag(argv: Sequence[str]) -> list[str]:
  """``argv`` without ``--debug`` (only before a ``--`` separator, which ends the options)."""
  opts = _options(argv)
  return [a for a in opts if a != DEBUG_FLAG] + list(argv[len(opts):])


def _options(argv: Sequence[str]) -> list[str]:
  argv = list(argv)
  return argv[:argv.index("--")] if "--" in argv else argv


def run_main(main: Callable[[list[str]], object], argv: Sequence[str] | None = None) -> NoReturn:
  """Run ``main(argv)`` as a command: user errors become one ``error:`` line and exit status 2.

  argv: the arguments (default ``sys.argv[1:]``); ``--debug`` is taken out before ``main`` sees
  them. Exits 0 when ``main`` returns; ``SystemExit`` (argparse's own errors, ``--help``) passes
  through unchanged.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  debug = debug_requested(argv)
  try:
    main(strip_debug_flag(argv))
  except KeyboardInterrupt:
    if debug:
      traceback.print_exc()
    _report("interrupted")
    sys.exit(INTERRUPT_STATUS)
  except Exception as e:  # noqa: BLE001 - classified below; anything else is re-raised
    if not is_user_error(e):
      raise
    if debug:
      traceback.print_exc()
    _report(full_text(e) if debug else shorten(one_line(e)))
    sys.exit(USAGE_STATUS)
  sys.exit(0)


def _report(message: str) -> None:
  sys.stdout.flush()
  print(f"error: {message}", file=sys.stderr, flush=True)
