"""
RowSearch (``boundeddb._core.rejects``) in memory: a fake "database" that refuses any attempt holding
a bad row, naming the first bad row's line (PostgreSQL's ``COPY t, line N``) or naming none (a foreign
key, MySQL, SQLite). Every good row is written exactly once, every bad row rejected, and the rows sent
stay within a small multiple of the chunk.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from boundeddb._core.rejects import Attempt, RowSearch


class Refusal(Exception):
    """The fake database's refusal of one row."""


def offsets(attempt: Attempt) -> list[int]:
    """The chunk offsets an attempt sends, in order."""
    return [offset for start, stop in attempt.spans for offset in range(start, stop)]


def refuse(rows: RowSearch, attempt: Attempt, offset: int, *, named: bool) -> None:
    """Tell ``rows`` the database refused ``attempt`` at chunk offset ``offset``, naming the row or not."""
    rows.refused(attempt, Refusal(offset), offset if named else None)


def search(
    size: int, bad: set[int], *, lines: bool | set[int], pick: str = "first", alone: int = 0
) -> tuple[RowSearch, Counter[int], int]:
    """
    Run a RowSearch over a chunk of ``size`` rows whose ``bad`` offsets the fake database refuses,
    naming the refused row if ``lines`` is True, or if it is one of ``lines`` (a set). It refuses
    the ``pick`` of the attempt's bad rows: the first, or the last (PostgreSQL's COPY checks a CHECK
    as it reads a row but a unique key when it flushes its buffer, so it may name a later row first).
    The last ``alone`` rows are set aside, to go one by one.
    """
    rows = RowSearch(size, alone)
    written: Counter[int] = Counter()
    attempts = 0
    while (attempt := rows.next()) is not None:
        attempts += 1
        assert attempts <= 10 * size + 10, "the search does not end"
        sent = offsets(attempt)
        assert sent, attempt
        assert len(set(sent)) == len(sent), attempt
        assert all(0 <= offset < size for offset in sent), attempt
        refused = [offset for offset in sent if offset in bad]
        if refused:
            offset = refused[0] if pick == "first" else refused[-1]
            named = lines if isinstance(lines, bool) else offset in lines
            refuse(rows, attempt, offset, named=named)
        else:
            written.update(sent)
            rows.loaded(attempt)
    return rows, written, attempts


def check(
    size: int, bad: set[int], *, lines: bool | set[int], pick: str = "first", alone: int = 0
) -> RowSearch:
    """Every good row written once, every bad one rejected once with its own error; the search returned."""
    rows, written, _ = search(size, bad, lines=lines, pick=pick, alone=alone)
    assert written == Counter(offset for offset in range(size) if offset not in bad)
    assert sorted(offset for offset, _ in rows.rejected) == sorted(bad)
    assert all(isinstance(error, Refusal) and error.args[0] == offset for offset, error in rows.rejected)
    return rows


LAYOUTS = {
    "none": (20, set()),
    "first": (20, {0}),
    "last": (20, {19}),
    "first-and-last": (20, {0, 19}),
    "adjacent": (20, {7, 8, 9}),
    "pairs": (33, {0, 1, 15, 16, 31, 32}),
    "all": (17, set(range(17))),
    "all-but-one": (16, set(range(16)) - {5}),
    "single-good": (1, set()),
    "single-bad": (1, {0}),
    "two-bad": (2, {0, 1}),
    "every-other": (40, set(range(0, 40, 2))),
}


@pytest.mark.parametrize(
    ("lines", "pick"),
    [(True, "first"), (True, "last"), (False, "first")],
    ids=["lines", "lines-last-named", "bisection"],
)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_good_row_is_written_once_and_every_bad_row_rejected(
    layout: str, lines: bool, pick: str
) -> None:
    """Bad rows at the start, the end, side by side, everywhere: each good row once, each bad one rejected."""
    size, bad = LAYOUTS[layout]
    rows = check(size, bad, lines=lines, pick=pick)
    if not bad:
        assert rows.sent == size, "a chunk without a bad row goes in one attempt"


@pytest.mark.parametrize(
    ("lines", "pick"),
    [(True, "first"), (True, "last"), (False, "first")],
    ids=["lines", "lines-last-named", "bisection"],
)
def test_random_layouts(lines: bool, pick: str) -> None:
    """Two hundred random chunks and bad-row sets: the same promise every time."""
    generator = random.Random(20261129)
    for _ in range(200):
        size = generator.randint(1, 300)
        bad = {offset for offset in range(size) if generator.random() < generator.choice((0.01, 0.1, 0.5))}
        check(size, bad, lines=lines, pick=pick)


def test_a_later_row_named_first_does_not_lose_the_rows_carried_after_an_earlier_one() -> None:
    """Rows 0 and 24 bad, 24 named first then 0 (COPY's order): rows 1 to 23 are still written, once."""
    rows = check(25, {0, 24}, lines=True, pick="last")
    assert sorted(offset for offset, _ in rows.rejected) == [0, 24]


def test_random_layouts_where_only_some_refusals_name_their_row() -> None:
    """PostgreSQL names a unique violation's line, not a foreign key's: both kinds mixed in one chunk."""
    generator = random.Random(1129)
    for _ in range(200):
        size = generator.randint(1, 300)
        bad = {offset for offset in range(size) if generator.random() < 0.05}
        check(size, bad, lines={offset for offset in bad if generator.random() < 0.5})


def test_a_refusal_that_names_no_row_is_bisected() -> None:
    """Without a named row the refused attempt goes again as its two halves, the first half first."""
    rows = RowSearch(8)
    first = rows.next()
    assert first is not None
    assert offsets(first) == list(range(8))
    refuse(rows, first, 5, named=False)
    halves = [rows.next(), rows.next()]
    assert [offsets(half) for half in halves if half is not None] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def spread(size: int, count: int, seed: int) -> set[int]:
    """``count`` bad offsets spread at random through ``size`` rows."""
    return set(random.Random(seed).sample(range(size), count))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_with_line_numbers_50_bad_rows_in_5000_cost_a_small_multiple(seed: int) -> None:
    """With the refused row named, 50 bad rows spread in 5000 send at most 4x the chunk's rows."""
    size = 5000
    rows = check(size, spread(size, 50, seed), lines=True)
    assert rows.sent <= 4 * size, rows.sent


def test_with_line_numbers_evenly_spread_bad_rows_cost_a_few_statements_each() -> None:
    """
    A bad row every 100 rows: at most 2 statements per bad row, and 5x the chunk's rows (the search
    trades rows for round trips: the rows before a refused one go again in the next statement).
    """
    size = 5000
    rows, _, statements = search(size, set(range(99, size, 100)), lines=True)
    assert statements <= 2 * 50 + 2, statements
    assert rows.sent <= 5 * size, rows.sent
    assert check(size, {size - 1}, lines=True).sent <= 2 * size, "a bad last row costs the chunk twice"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bisection_alone_is_bounded_too(seed: int) -> None:
    """Without line numbers, 50 bad rows in 5000 send at most the chunk times (log2(5000 / 50) + 2)."""
    size, count = 5000, 50
    rows = check(size, spread(size, count, seed), lines=False)
    assert rows.sent <= size * (math.log2(size / count) + 2), rows.sent


def test_bisection_of_one_bad_row_sends_about_log2_chunks() -> None:
    """One bad row among 4096: each halving sends both halves of the refused one, so under 3x the chunk."""
    size = 4096
    rows = check(size, {1234}, lines=False)
    assert rows.sent <= 3 * size, rows.sent


def test_rows_set_aside_go_one_by_one_after_the_others() -> None:
    """alone=3: the first seven rows in one attempt, then each of the last three alone, bad or good."""
    rows = RowSearch(10, alone=3)
    attempts = []
    while (attempt := rows.next()) is not None:
        attempts.append((attempt.spans, attempt.exact))
        if offsets(attempt) == [8]:
            refuse(rows, attempt, 8, named=False)
        else:
            rows.loaded(attempt)
    assert attempts == [(((0, 7),), False), (((7, 8),), True), (((8, 9),), True), (((9, 10),), True)]
    assert [offset for offset, _ in rows.rejected] == [8]
    assert rows.done
    assert rows.sent == 10


@pytest.mark.parametrize("lines", [True, False], ids=["lines", "bisection"])
def test_random_layouts_with_rows_set_aside(lines: bool) -> None:
    """Bad rows among the set-aside and the others: the same promise; set aside, they cost no search."""
    rng = random.Random(44)
    for _ in range(200):
        size = rng.randint(1, 60)
        alone = rng.randint(0, size)
        bad = {offset for offset in range(size) if rng.random() < 0.2}
        rows = check(size, bad, lines=lines, alone=alone)
        if all(offset >= size - alone for offset in bad):
            assert rows.sent == size, "each bad row set aside is sent once, alone"
