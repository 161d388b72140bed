"""The lock that runs ``measures`` tests alone under pytest-xdist (tests/measuring.py), with threads
standing in for workers: flock locks are per open file, so two threads conflict as two processes
do."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from measuring import RUN_DIR, RunLock, running_alone

WAIT_S = 10.0  # for what must happen; what must not happen is checked after a short wait
SHORT_S = 0.3


class Holder(threading.Thread):
    """Takes the lock (exclusive or shared), says so, and holds it until released."""

    def __init__(self, folder: Path, alone: bool):
        super().__init__(daemon=True)
        self.folder, self.alone = folder, alone
        self.entered, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        with running_alone(self.alone, self.folder):
            self.entered.set()
            self.release.wait(WAIT_S)


def _holding(folder: Path, alone: bool) -> Holder:
    h = Holder(folder, alone)
    h.start()
    return h


def test_shared_holders_run_together(tmp_path):
    a, b = _holding(tmp_path, False), _holding(tmp_path, False)
    assert a.entered.wait(WAIT_S) and b.entered.wait(WAIT_S)
    a.release.set(), b.release.set()


def test_a_measuring_test_waits_for_the_others_and_they_wait_for_it(tmp_path):
    other = _holding(tmp_path, False)
    assert other.entered.wait(WAIT_S)
    measuring = _holding(tmp_path, True)
    assert not measuring.entered.wait(SHORT_S)  # the other worker's test is still running
    other.release.set()
    assert measuring.entered.wait(WAIT_S)
    later = _holding(tmp_path, False)
    assert not later.entered.wait(SHORT_S)  # the next test waits until the measuring one ends
    measuring.release.set()
    assert later.entered.wait(WAIT_S)
    later.release.set()


def test_a_waiting_measuring_test_is_not_starved_by_new_shared_holders(tmp_path):
    """The turnstile: once a measuring test waits, a test started after it waits behind it, even
    while another shared holder still runs."""
    first = _holding(tmp_path, False)
    assert first.entered.wait(WAIT_S)
    measuring = _holding(tmp_path, True)
    assert not measuring.entered.wait(SHORT_S)
    second = _holding(tmp_path, False)
    assert not second.entered.wait(SHORT_S)  # without the turnstile it would join ``first``
    first.release.set()
    assert measuring.entered.wait(WAIT_S) and not second.entered.is_set()
    measuring.release.set()
    assert second.entered.wait(WAIT_S)
    second.release.set()


def test_other_test_runs_do_not_share_the_lock(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = _holding(tmp_path / "a", True)
    b = _holding(tmp_path / "b", True)
    assert a.entered.wait(WAIT_S) and b.entered.wait(WAIT_S)
    a.release.set(), b.release.set()


def test_a_run_of_measuring_tests_keeps_its_hold_and_others_wait_for_the_whole_run(tmp_path):
    """A worker keeps its exclusive hold from one ``measures`` test to the next (taking it again is
    a no-op, not a deadlock); the other worker's next test waits until the run ends."""
    lock = RunLock(tmp_path)
    lock.take(True)
    other = _holding(tmp_path, False)
    assert not other.entered.wait(SHORT_S)
    lock.take(True)  # the next measuring test of the run
    assert lock.held and not other.entered.wait(SHORT_S)
    lock.release()
    assert not lock.held and other.entered.wait(WAIT_S)
    other.release.set()


@pytest.mark.slow
def test_the_measuring_tests_of_every_module_run_first_and_together_on_one_worker(
    pytester, monkeypatch
):
    """A real ``pytest -n 2`` over three modules, two of which have a ``measures`` test: both run on
    one worker, one after the other, before that worker's other tests (plain ``loadscope`` runs
    each with its module, on two workers here)."""
    for name in (
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_TESTRUNUID",
        "PYTEST_XDIST_WORKER_COUNT",
        RUN_DIR,
    ):
        monkeypatch.delenv(name, raising=False)  # this test may itself run in a worker
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    pytester.makeini("[pytest]\nmarkers =\n    measures: times real runs\n")
    pytester.makeconftest("pytest_plugins = ['measuring']\n")
    measures = "import pytest\nmeasures = pytest.mark.measures\n"
    pytester.makepyfile(
        test_a=measures
        + "def test_a1(): pass\n@measures\ndef test_a2(): pass\ndef test_a3(): pass\n",
        test_b=measures + "@measures\ndef test_b1(): pass\ndef test_b2(): pass\n",
        test_c="def test_c1(): pass\ndef test_c2(): pass\n",
    )
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "loadscope", "-v")
    result.assert_outcomes(passed=7)
    ran: dict[str, list[str]] = {}
    for line in result.outlines:
        if " PASSED " in line and line.startswith("[gw"):
            ran.setdefault(line.split("]")[0][1:], []).append(line.split("::")[-1].strip())
    (worker,) = [w for w, tests in ran.items() if "test_a2" in tests]
    assert ran[worker][:2] == ["test_a2", "test_b1"], ran


@pytest.mark.slow
def test_after_the_measuring_tests_the_longest_modules_go_first(pytester, monkeypatch):
    """The units of work are handed out longest first, by a guess from the ``slow`` marks: a module
    of one slow test before one of five quick ones (xdist's own order is most tests first, which
    left a long module of few tests to the end of one worker while the others idled)."""
    for name in (
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_TESTRUNUID",
        "PYTEST_XDIST_WORKER_COUNT",
        RUN_DIR,
    ):
        monkeypatch.delenv(name, raising=False)  # this test may itself run in a worker
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    pytester.makeini(
        "[pytest]\nmarkers =\n    measures: times real runs\n    slow: takes seconds\n"
    )
    pytester.makeconftest("pytest_plugins = ['measuring']\n")
    pytester.makepyfile(
        test_many="".join(f"def test_quick{i}(): pass\n" for i in range(5)),
        test_long="import pytest\n@pytest.mark.slow\ndef test_long(): pass\n",
        test_x="import pytest\n@pytest.mark.measures\ndef test_measured(): pass\n",
    )
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "1", "--dist", "loadscope", "-v")
    result.assert_outcomes(passed=7)
    ran = [line.split("::")[-1].split()[0] for line in result.outlines if " PASSED " in line]
    assert ran[:3] == ["test_measured", "test_long", "test_quick0"], ran
