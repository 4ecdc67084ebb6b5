"""The exception tree: one root, builtin parents, RunFailed's group behaviour, pickling."""

from __future__ import annotations

import copy
import pickle
import sys

import pytest

import boundeddb
from boundeddb import (
    BoundedDBError,
    LoadFailed,
    LoadReport,
    Outcome,
    RejectedRow,
    RowRefused,
    RunFailed,
    RunnerBusyElsewhereError,
    RunnerClosedError,
    RunReport,
    RunStats,
    UnitMisuseError,
    UnitTimeout,
    UnpicklableError,
    WorkerLostError,
    WorkerStartError,
)

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import ExceptionGroup


def exported_exceptions() -> list[type[BaseException]]:
    return [
        obj
        for name in boundeddb.__all__
        if isinstance(obj := getattr(boundeddb, name), type) and issubclass(obj, BaseException)
    ]


def make_stats(submitted: int = 3, failed: int = 2) -> RunStats:
    return RunStats(
        submitted=submitted,
        succeeded=submitted - failed,
        failed=failed,
        elapsed_s=1.5,
        throughput=submitted / 1.5,
        latency_p50_s=0.1,
        latency_p95_s=0.2,
        latency_p99_s=0.3,
        latency_max_s=0.4,
        peak_in_flight=2,
        peak_connections=2,
        retried=1,
    )


@pytest.fixture
def run_failed() -> RunFailed:
    """A RunFailed as a runner builds it: unit 0 committed, units 1 and 2 failed."""
    key_error, value_error = KeyError("k"), ValueError("v")
    report = RunReport(
        [
            Outcome(0, "ok", None, 0.1, 0.0),
            Outcome(1, None, key_error, 0.2, 0.0),
            Outcome(2, None, value_error, 0.3, 0.01, attempts=2),
        ],
        make_stats(),
    )
    return RunFailed("2 of 3 units failed", [key_error, value_error], report=report)


def test_every_exported_error_derives_from_bounded_db_error() -> None:
    """Every exception class boundeddb exports is a BoundedDBError, itself a plain Exception."""
    errors = exported_exceptions()
    assert set(errors) == {
        BoundedDBError,
        LoadFailed,
        RowRefused,
        RunFailed,
        RunnerBusyElsewhereError,
        RunnerClosedError,
        UnitMisuseError,
        UnitTimeout,
        UnpicklableError,
        WorkerLostError,
        WorkerStartError,
    }
    assert all(issubclass(error, BoundedDBError) for error in errors)
    assert BoundedDBError.__bases__ == (Exception,)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (RunFailed, ExceptionGroup),
        (UnitTimeout, TimeoutError),
        (UnitMisuseError, TypeError),
        (RunnerClosedError, RuntimeError),
        (RunnerBusyElsewhereError, RuntimeError),
        (WorkerLostError, RuntimeError),
        (WorkerStartError, RuntimeError),
        (UnpicklableError, TypeError),
    ],
)
def test_each_leaf_also_subclasses_the_closest_builtin(error: type[Exception], builtin: type) -> None:
    """Existing `except TimeoutError:` (and so on) clauses keep catching boundeddb's errors."""
    assert issubclass(error, builtin)
    assert issubclass(error, BoundedDBError)


def test_run_failed_is_an_exception_group_and_a_bounded_db_error(run_failed: RunFailed) -> None:
    """RunFailed is caught by `except BoundedDBError` and holds the units' own exceptions."""
    assert isinstance(run_failed, ExceptionGroup)
    assert isinstance(run_failed, BoundedDBError)
    assert run_failed.message == "2 of 3 units failed"
    assert str(run_failed) == "2 of 3 units failed (2 sub-exceptions)"
    assert run_failed.exceptions == tuple(o.error for o in run_failed.report.failures)
    with pytest.raises(BoundedDBError) as caught:
        raise run_failed
    assert caught.value is run_failed


@pytest.mark.parametrize("method", ["split", "subgroup"])
def test_split_and_subgroup_keep_the_type_and_the_report(run_failed: RunFailed, method: str) -> None:
    """Splitting the group (as `except*` does) keeps RunFailed and the very same report."""
    if method == "split":
        matched, rest = run_failed.split(KeyError)
        assert isinstance(rest, RunFailed)
        assert rest.report is run_failed.report
        assert [type(e) for e in rest.exceptions] == [ValueError]
    else:
        matched = run_failed.subgroup(KeyError)
    assert isinstance(matched, RunFailed)
    assert matched.report is run_failed.report
    assert matched.message == run_failed.message
    assert matched.exceptions == (run_failed.exceptions[0],)


def test_derive_keeps_the_type_and_the_report(run_failed: RunFailed) -> None:
    """derive() builds a RunFailed with the same message and report around other exceptions."""
    other = [OSError("o")]
    derived = run_failed.derive(other)
    assert type(derived) is RunFailed
    assert derived.report is run_failed.report
    assert derived.message == run_failed.message
    assert list(derived.exceptions) == other


@pytest.mark.parametrize("roundtrip", ["pickle", "deepcopy"])
def test_run_failed_round_trips(run_failed: RunFailed, roundtrip: str) -> None:
    """A RunFailed survives pickle (say, from a worker process) with its exceptions and report."""
    restored = pickle.loads(pickle.dumps(run_failed)) if roundtrip == "pickle" else copy.deepcopy(run_failed)
    assert type(restored) is RunFailed
    assert restored.message == run_failed.message
    assert [(type(e), e.args) for e in restored.exceptions] == [(KeyError, ("k",)), (ValueError, ("v",))]
    report = restored.report
    assert report.stats == run_failed.report.stats
    assert [(o.index, o.value, o.attempts) for o in report.outcomes] == [
        (0, "ok", 1),
        (1, None, 1),
        (2, None, 2),
    ]
    # The group and the report still share the exception objects, as they did before.
    assert restored.exceptions[0] is report.outcomes[1].error
    assert restored.exceptions[1] is report.outcomes[2].error


def test_unit_timeout_is_a_timeout_error_with_index_and_timeout() -> None:
    """UnitTimeout says which unit and which timeout, and `except TimeoutError` catches it."""
    error = UnitTimeout(3, 0.5)
    assert error.index == 3
    assert error.timeout == 0.5
    assert error.args == ("unit 3 did not finish within timeout=0.5 s",)
    with pytest.raises(TimeoutError, match=r"^unit 3 did not finish within timeout=0\.5 s$"):
        raise error


def test_unit_timeout_round_trips_through_pickle() -> None:
    """A pickled UnitTimeout comes back with its index, timeout and message."""
    restored = pickle.loads(pickle.dumps(UnitTimeout(7, 1.25)))
    assert type(restored) is UnitTimeout
    assert (restored.index, restored.timeout) == (7, 1.25)
    assert str(restored) == "unit 7 did not finish within timeout=1.25 s"


@pytest.mark.parametrize("roundtrip", ["pickle", "deepcopy"])
def test_load_failed_round_trips_with_its_report(roundtrip: str) -> None:
    """A LoadFailed survives pickle and deepcopy with its message and its report of what committed."""
    rejected = RejectedRow(7, {"key": "k"}, ValueError("refused"))
    failed = LoadFailed("row 7 was refused", report=LoadReport(20, 5, [rejected], 1, make_stats()))
    restored = pickle.loads(pickle.dumps(failed)) if roundtrip == "pickle" else copy.deepcopy(failed)
    assert isinstance(restored, LoadFailed)
    assert str(restored) == "row 7 was refused"
    report = restored.report
    assert (report.loaded, report.skipped, report.transactions) == (20, 5, 1)
    assert (report.rejected[0].index, report.rejected[0].row) == (7, {"key": "k"})
    assert str(report.rejected[0].error) == "refused"


def test_unit_misuse_error_is_caught_as_a_type_error() -> None:
    """A unit written wrongly is a TypeError to callers that only know the builtins."""
    with pytest.raises(TypeError, match=r"^unit 0 is not callable$"):
        raise UnitMisuseError("unit 0 is not callable")


@pytest.mark.parametrize("error", [RunnerClosedError, RunnerBusyElsewhereError])
def test_runner_state_errors_are_runtime_errors(error: type[BoundedDBError]) -> None:
    """Using a closed runner, or a busy one from another loop, is a RuntimeError."""
    with pytest.raises(RuntimeError, match=r"^runner says no$"):
        raise error("runner says no")
