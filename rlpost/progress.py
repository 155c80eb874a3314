"""Progress bars that suit where the output goes.

``bar(...)`` is a tqdm bar: on a terminal (or in a notebook) the usual redrawn bar with ETA;
otherwise (a log file, a pipe, a captured test) plain lines, one at most every ``LINE_INTERVAL``
seconds plus the first and the last, with no carriage returns, so a log reads as a sequence of
lines. ``message(bar, log, text)`` prints a line that neither garbles nor repeats the bar.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable

from tqdm import auto, autonotebook, std

# Seconds between two plain progress lines (output that is not a terminal).
LINE_INTERVAL = 30.0


class _Lines:
  """A file for tqdm that turns its carriage-return frames into lines."""

  def __init__(self, out):
    self.out = out

  def write(self, s: str) -> None:
    # A frame is "\r<status><padding>"; clearing writes "\r<spaces>\r", which is dropped.
    line = s.replace("\r", "").rstrip()
    if line:
      self.out.write(line + "\n")

  def flush(self) -> None:
    self.out.flush()


class _PlainBar(std.tqdm):
  """A bar printed as lines: a new postfix or description waits for the next line instead of
  printing one of its own."""

  def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
    super().set_postfix(ordered_dict, refresh=False, **kwargs)

  def set_postfix_str(self, s="", refresh=True):
    super().set_postfix_str(s, refresh=False)

  def set_description(self, desc=None, refresh=True):
    super().set_description(desc, refresh=False)

  def set_description_str(self, desc=None, refresh=True):
    super().set_description_str(desc, refresh=False)


def interactive() -> bool:
  """Whether bars can redraw in place: stderr is a terminal, or this is a notebook."""
  return sys.stderr.isatty() or autonotebook.tqdm is not std.tqdm


def bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str | None = None,
        disable: bool = False, leave: bool = True, **kw) -> std.tqdm:
  """A tqdm bar with ETA on stderr, redrawn on a terminal and as plain lines otherwise."""
  if interactive():
    return auto.tqdm(iterable, total=total, desc=desc, disable=disable, leave=leave,
                     dynamic_ncols=True, **kw)
  # position=0: a bar below another would move the cursor with escape sequences.
  return _PlainBar(iterable, total=total, desc=desc, disable=disable, leave=True,
                   file=_Lines(sys.stderr), mininterval=LINE_INTERVAL, ncols=100, position=0,
                   **kw)


def message(b: std.tqdm | None, log: Callable[[str], None], text: str) -> None:
  """``log(text)`` on its own line: above a redrawn bar (cleared, then drawn again)."""
  redraw = b is not None and not b.disable and not isinstance(b, _PlainBar)
  if redraw:
    b.clear()
  log(text)
  if redraw:
    b.refresh()
