# SPDX-License-Identifier: LGPL-2.1-or-later
"""pytest plugin: one TAP line per test on file descriptor 3 (stdout when fd 3
is not open), for automake's TAP driver; pytest's own report goes to stderr
(tests/python.sh redirects it), so the two never mix."""
import os
import sys

_out = None
_n = 0
_outcome = {}
_collect_errors = []


def _write(line):
    _out.write(line + "\n")
    _out.flush()


def pytest_configure(config):
    global _out
    try:
        os.fstat(3)
        _out = os.fdopen(3, "w")
    except OSError:
        _out = sys.stdout


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid or "collection")


def pytest_collection_modifyitems(session, config, items):
    _write("1..%d" % (len(items) + len(_collect_errors)))
    global _n
    for nodeid in _collect_errors:
        _n += 1
        _write("not ok %d - collecting %s" % (_n, nodeid))


def pytest_runtest_logreport(report):
    cur = _outcome.get(report.nodeid, ("passed", ""))
    if report.failed:
        _outcome[report.nodeid] = ("failed", report.when)
    elif report.skipped and cur[0] == "passed":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _outcome[report.nodeid] = ("skipped", reason)


def pytest_runtest_logfinish(nodeid, location):
    global _n
    _n += 1
    what, detail = _outcome.pop(nodeid, ("passed", ""))
    if what == "failed":
        _write("not ok %d - %s (%s failed)" % (_n, nodeid, detail))
    elif what == "skipped":
        _write("ok %d - %s # SKIP %s" % (_n, nodeid, detail.replace("\n", " ")))
    else:
        _write("ok %d - %s" % (_n, nodeid))
