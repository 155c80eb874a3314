"""tests/ci_skips.py: under CI=true a skipped oracle test fails; without CI it skips.

Each case runs pytest in a subprocess on a few small test files whose conftest installs the same
hooks as tests/conftest.py. Stand-in ``torch`` and ``trl`` modules that raise ModuleNotFoundError
play a missing oracle extra, so the cases neither import the real packages nor depend on them.
"""

import os

import pytest

pytest_plugins = ["pytester"]

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
CONFTEST = "from ci_skips import pytest_make_collect_report, pytest_runtest_makereport\n"
INI = "[pytest]\nmarkers =\n  oracle: needs the oracle extra\n"
MISSING = 'raise ModuleNotFoundError("stand-in: the oracle extra is not installed")\n'

FILES = {
    # A function-level importorskip in a test marked oracle, of a module no extra provides.
    "test_marked": """
        import pytest

        @pytest.mark.oracle
        def test_marked_oracle():
          pytest.importorskip("no_such_module_xyz")

        def test_plain():
          assert 1 + 1 == 2
        """,
    # A module-level importorskip of an oracle package: it skips while the module is collected.
    "test_module_level": """
        import pytest
        torch = pytest.importorskip("torch")
        pytestmark = pytest.mark.oracle

        def test_never_runs():
          assert False
        """,
    # An unmarked test skipped for a missing oracle package.
    "test_unmarked": """
        import pytest

        def test_needs_trl():
          pytest.importorskip("trl")
        """,
    # Skips and expected failures that have nothing to do with the oracle extra.
    "test_other": """
        import pytest

        def test_other_skip():
          pytest.skip("needs a GPU")

        def test_other_import():
          pytest.importorskip("no_such_module_xyz")

        def test_similar_words():
          pytest.skip("no ctrl-c handler; pytorch_lightning_like is not a package name here")

        @pytest.mark.xfail(reason="known torch difference", strict=True)
        def test_expected_failure():
          assert False
        """,
}


def run_inner(pytester, monkeypatch, ci, *args, files=FILES):
  """pytest in a subprocess on ``files`` with CI set to ``ci`` (None: unset)."""
  pytester.makeconftest(CONFTEST)
  pytester.makeini(INI)
  pytester.makepyfile(torch=MISSING, trl=MISSING)
  pytester.makepyfile(**files)
  monkeypatch.setenv("PYTHONPATH", TESTS_DIR)
  if ci is None:
    monkeypatch.delenv("CI", raising=False)
  else:
    monkeypatch.setenv("CI", ci)
  return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-rA", *args)


def test_ci_turns_oracle_skips_into_failures(pytester, monkeypatch):
  result = run_inner(pytester, monkeypatch, "true", "--continue-on-collection-errors")
  result.assert_outcomes(passed=1, failed=2, skipped=3, xfailed=1, errors=1)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  result.stdout.fnmatch_lines([
      "ERROR test_module_level.py - oracle test skipped under CI: could not import 'torch': "
      "stand-in: the oracle extra is not installed; install the oracle extra*",
      "FAILED test_marked.py::test_marked_oracle - oracle test skipped under CI: could not "
      "import 'no_such_module_xyz'*; install the oracle extra*",
      "FAILED test_unmarked.py::test_needs_trl - oracle test skipped under CI: could not "
      "import 'trl'*",
  ])
  result.stdout.fnmatch_lines([
      "SKIPPED * test_other.py:*: needs a GPU",
      "SKIPPED * test_other.py:*: could not import 'no_such_module_xyz'*",
      "SKIPPED * test_other.py:*: no ctrl-c handler*",
      "XFAIL test_other.py::test_expected_failure*",
  ], consecutive=True)


def test_collection_skip_alone_fails_the_run_under_ci(pytester, monkeypatch):
  """Without --continue-on-collection-errors a module-level oracle skip stops the run."""
  files = {"test_only": "import pytest\npytest.importorskip('torch')\n\n"
                        "def test_never_runs():\n  assert False\n"}
  result = run_inner(pytester, monkeypatch, "true", files=files)
  assert result.ret == pytest.ExitCode.INTERRUPTED
  result.stdout.fnmatch_lines(["*oracle test skipped under CI: could not import 'torch'*"])
  result = run_inner(pytester, monkeypatch, None, files=files)
  assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
  result.assert_outcomes(skipped=1)


@pytest.mark.parametrize("ci", [None, "false"])
def test_without_ci_true_oracle_tests_skip(pytester, monkeypatch, ci):
  result = run_inner(pytester, monkeypatch, ci)
  result.assert_outcomes(passed=1, skipped=6, xfailed=1)
  assert result.ret == pytest.ExitCode.OK
  assert "oracle test skipped under CI" not in result.stdout.str()
