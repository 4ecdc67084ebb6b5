"""The chaos soak's own tests: its checker finds what it must, and a wrong client is caught writing twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.chaos.checker import bank_anomalies, check
from tests.chaos.proxy import _MySQLSplitter, _PostgresSplitter
from tests.chaos.records import classify
from tests.chaos.server import server_available

ROOT = Path(__file__).resolve().parents[2]


def _op(op: str, cls: str) -> dict[str, str]:
    return {"op": op, "workload": op.partition(":")[0], "cls": cls, "why": "test"}


def test_each_rule_of_the_checker_finds_its_anomaly() -> None:
    """Lost, doubled, fail-present, info twice, invented, an op written twice: each found, nothing else."""
    history = [
        _op("w:ok", "ok"),
        _op("w:lost", "ok"),
        _op("w:twice", "ok"),
        _op("w:fail", "fail"),
        _op("w:failed-but-there", "fail"),
        _op("w:info-there", "info"),
        _op("w:info-absent", "info"),
        _op("w:info-twice", "info"),
        _op("w:ok", "ok"),
    ]
    present = {
        "w:ok": 1,
        "w:twice": 2,
        "w:failed-but-there": 1,
        "w:info-there": 1,
        "w:info-twice": 2,
        "x:9": 1,
    }
    verdict = check(history, present)
    found = {
        kind: sorted(a.detail.split(":", 2)[1] for a in anomalies)
        for kind, anomalies in verdict.anomalies.items()
    }
    assert found == {
        "lost": ["lost"],
        "doubled": ["info-twice", "twice"],
        "fail-present": ["failed-but-there"],
        "invented": ["9"],
        "history": ["ok written down twice"],
    }
    assert verdict.count == 6
    assert dict(verdict.ops["w"]) == {"ok": 3, "fail": 2, "info": 3, "info-present": 1, "info-absent": 1}


def test_a_clean_history_has_no_anomaly() -> None:
    """Every ok present once, every fail absent, every info at most once: nothing to report."""
    verdict = check(
        [_op("a:1", "ok"), _op("a:2", "fail"), _op("a:3", "info"), _op("a:4", "info")], {"a:1": 1, "a:3": 1}
    )
    assert verdict.count == 0


def test_the_bank_check_finds_a_moved_total_and_a_half_applied_transfer() -> None:
    """A total that changed, and balances that the transfers present do not explain, are both found."""
    assert bank_anomalies({0: 90, 1: 110}, [(0, 1, 10)], opening=100, total=200) == []
    moved = bank_anomalies({0: 90, 1: 100}, [(0, 1, 10)], opening=100, total=200)
    assert len(moved) == 2
    assert moved[0] == "total 190, not 200"
    half = bank_anomalies({0: 100, 1: 100}, [(0, 1, 10)], opening=100, total=200)
    assert half == [
        "2 balances not what the transfers present say (balance, expected): {0: (100, 90), 1: (100, 110)}"
    ]


@pytest.mark.parametrize(
    ("returned", "outcome", "expected"),
    [
        (True, None, "ok"),
        (False, None, "fail"),
        (False, SimpleNamespace(ok=True, commit_unknown=False, error=None), "ok"),
        (False, SimpleNamespace(ok=False, commit_unknown=True, error=OSError()), "info"),
        (False, SimpleNamespace(ok=False, commit_unknown=False, error=OSError()), "fail"),
    ],
    ids=["returned", "no-outcome", "outcome-ok", "outcome-unknown", "outcome-failed"],
)
def test_a_call_is_classified_as_the_guarantees_page_defines(
    returned: bool, outcome: object, expected: str
) -> None:
    """A returned call is ok; a raised or cancelled one goes by its outcome, and without one it is fail."""
    assert classify(returned, outcome)[0] == expected


def test_the_proxy_finds_a_commit_in_each_protocol_however_the_bytes_arrive() -> None:
    """PostgreSQL's and MySQL's framing, fed a byte at a time: the COMMIT is found, nothing else is."""
    startup = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")  # SSLRequest
    startup += (9).to_bytes(4, "big") + (196608).to_bytes(4, "big") + b"\x00"
    query = b"SELECT 1\x00"
    commit = b"COMMIT;\x00"
    stream = startup + b"Q" + (4 + len(query)).to_bytes(4, "big") + query
    stream += b"Q" + (4 + len(commit)).to_bytes(4, "big") + commit
    postgres = _PostgresSplitter()
    found = [flag for byte in stream for _, flag in postgres.feed(bytes([byte]))]
    assert found == [False, False, False, True]

    def packet(payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "little") + b"\x00" + payload

    mysql = _MySQLSplitter()
    stream = packet(b"\x03SELECT 1") + packet(b"\x03 commit ") + packet(b"\x03COMMIT")
    found = [flag for byte in stream for _, flag in mysql.feed(bytes([byte]))]
    assert found == [False, True, True]


@pytest.mark.slow
def test_a_client_that_retries_a_lost_commit_without_asking_is_caught_writing_twice(tmp_path: Path) -> None:
    """The soak with a hand-written client that retries after a lost COMMIT reply reports doubled writes."""
    if (reason := server_available()) is not None:
        pytest.skip(reason)
    command = [
        sys.executable, "-m", "tests.chaos", "--duration", "15", "--seed", "54", "--out", str(tmp_path),
        "--workloads", "none", "--jobs", "none", "--wrong-client", "--faults", "commit-reply-drop",
        "--crash-every", "0", "--no-mysql",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 1, f"exit status {done.returncode}:\n{done.stdout}\n{done.stderr}"
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["anomalies_by_kind"]) == {"doubled"}, report["anomalies_by_kind"]
    doubled = report["anomalies_by_kind"]["doubled"]
    assert doubled["count"] >= 3
    assert all(example.startswith("wrong-retry:") for example in doubled["examples"])
    assert report["faults"]["commit-reply-drop"] >= 3
