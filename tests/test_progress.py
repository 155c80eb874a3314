"""Progress bars: plain lines without carriage returns when stderr is not a terminal."""

import io

from rlpost import progress


def test_bar_prints_plain_lines_when_not_a_terminal(monkeypatch):
  err = io.StringIO()  # not a terminal
  monkeypatch.setattr("sys.stderr", err)
  logged = []
  b = progress.bar(total=4, desc="work")
  for i in range(4):
    b.update(1)
    b.set_postfix(loss=f"{i:.1f}")  # waits for the next line instead of printing one
    progress.message(b, logged.append, f"note {i}")
  b.close()
  for _ in progress.bar(range(3), desc="more", leave=False):
    pass
  text = err.getvalue()
  assert "\r" not in text and "\x1b" not in text
  lines = text.splitlines()
  # The first and the last state of each bar, one line each (the interval is 30 s).
  assert len(lines) == 4, lines
  assert lines[0].startswith("work:   0%") and lines[1].startswith("work: 100%")
  assert "4/4" in lines[1] and "loss=3.0" in lines[1]
  assert lines[3].startswith("more: 100%")
  assert logged == [f"note {i}" for i in range(4)]


def test_disabled_bar_prints_nothing_and_messages_still_log(monkeypatch):
  err = io.StringIO()
  monkeypatch.setattr("sys.stderr", err)
  logged = []
  b = progress.bar(total=2, desc="off", disable=True)
  b.update(2)
  progress.message(b, logged.append, "still here")
  b.close()
  progress.message(None, logged.append, "no bar")
  assert err.getvalue() == "" and logged == ["still here", "no bar"]
