"""scripts/pytest_memlog.py: each test gets a START and an END line with its memory."""

import os
import re

pytest_plugins = ["pytester"]


def test_memlog_writes_a_line_per_test(pytester, monkeypatch, tmp_path):
  log_dir = tmp_path / "memlog"
  monkeypatch.setenv("RLPOST_MEMLOG_DIR", str(log_dir))
  monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner run is "main"
  monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  pytester.makepyfile(test_two="def test_a():\n  assert True\n\ndef test_b():\n  x = [0] * 10\n")
  result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                         "-p", "scripts.pytest_memlog")
  result.assert_outcomes(passed=2)
  lines = (log_dir / "mem_main.log").read_text().splitlines()
  assert [line.split()[1:3] for line in lines] == [["START", "test_two.py::test_a"],
                                                   ["END", "test_two.py::test_a"],
                                                   ["START", "test_two.py::test_b"],
                                                   ["END", "test_two.py::test_b"]]
  rss, hwm = map(int, re.search(r"rss=(\d+) hwm=(\d+)", lines[-1]).groups())
  assert 0 < rss <= hwm
  assert (log_dir / "fault_main.log").exists()

