"""Under ``CI=true`` a skipped oracle test fails the run instead of passing silently.

Oracle tests compare rlpost against independent implementations (torch, transformers, trl) and
skip when the oracle extra is not installed. On a developer's machine that is a convenience; in
CI it would hide that the cross-checks never ran. These hooks turn such skips into failures
when the environment variable ``CI`` is ``"true"``:

* a test marked ``oracle`` that skips, for any reason, in setup, call or teardown;
* any test or module whose skip reason names an oracle package or another package of
  ``CI_PACKAGES`` (what ``pytest.importorskip``
  writes: "could not import 'torch': ..."), including module-level ``importorskip`` calls,
  which skip the whole module while it is collected.

Skips for other reasons (a missing ``h5py``, an explicit ``pytest.skip("...")``) and expected
failures are left alone. ``tests/conftest.py`` installs the hooks; a conftest elsewhere can do
the same with ``from ci_skips import pytest_make_collect_report, pytest_runtest_makereport``.
"""

from __future__ import annotations

import os
import re

import pytest

ORACLE_PACKAGES = ("torch", "transformers", "trl", "safetensors", "tokenizers")
# Optional packages that scripts/test.sh installs too: a test skipped for want of one fails in CI.
CI_PACKAGES = (*ORACLE_PACKAGES, "wandb")
_ORACLE_WORD = re.compile(r"\b(" + "|".join(CI_PACKAGES) + r")\b")


def ci_enabled() -> bool:
  """Whether this run is a CI run (``CI=true``, as set by ``.ci/run``)."""
  return os.environ.get("CI") == "true"


def skip_reason(report) -> str:
  """The reason text of a skipped test or collection report."""
  longrepr = report.longrepr
  reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
  return reason.removeprefix("Skipped: ")


def names_oracle_package(reason: str) -> bool:
  """Whether a skip reason names one of the oracle packages as a whole word."""
  return _ORACLE_WORD.search(reason) is not None


def failure_message(reason: str) -> str:
  return (f"oracle test skipped under CI: {reason}; install the oracle extra "
          "(pip install -e '.[oracle]', as scripts/test.sh does) or unset CI to allow the skip")


def _fail(report, reason: str) -> None:
  report.outcome = "failed"
  report.longrepr = failure_message(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  """Fail a skipped test that is marked ``oracle`` or skipped for a missing oracle package."""
  report = yield
  if ci_enabled() and report.skipped and not hasattr(report, "wasxfail"):
    reason = skip_reason(report)
    if item.get_closest_marker("oracle") is not None or names_oracle_package(reason):
      _fail(report, reason)
  return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
  """Fail the collection of a module skipped for a missing oracle package (a module-level
  ``pytest.importorskip`` runs before the module's ``pytestmark`` exists, so the reason is what
  identifies it)."""
  report = yield
  if ci_enabled() and report.outcome == "skipped":
    reason = skip_reason(report)
    if names_oracle_package(reason):
      _fail(report, reason)
  return report
