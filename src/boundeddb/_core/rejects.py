"""
Which rows of a chunk the database refuses: the search that ``load()`` runs inside each chunk's
transaction, one savepoint for all its attempts, without I/O of its own.

:doc:`/explanation/loads` tells the algorithm and what it costs.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["CARRY_WINDOWS", "FIRST_WINDOW", "Attempt", "RowSearch"]

#: The fewest new rows an attempt after a refused row sends while the search scans on.
FIRST_WINDOW: Final = 8
#: Rows known good and carried into the next attempt, in windows, above which they go alone first.
CARRY_WINDOWS: Final = 4

Spans = tuple[tuple[int, int], ...]


class Attempt:
    """
    Rows of a chunk sent in one statement: ``spans`` of offsets, ``(start, stop)`` each, in order.

    ``exact`` if the search chose its rows (a bisection, or rows known good), else a scan's window.
    """

    __slots__ = ("exact", "rows", "spans")

    def __init__(self, spans: Spans, *, exact: bool) -> None:
        self.spans = spans
        self.exact = exact
        #: How many rows it sends.
        self.rows = sum(stop - start for start, stop in spans)

    def offset(self, line: int) -> int | None:
        """The chunk offset of the attempt's ``line``-th row, from 1, or None if it has no such row."""
        if line < 1:
            return None
        for start, stop in self.spans:
            if line <= stop - start:
                return start + line - 1
            line -= stop - start
        return None

    def __repr__(self) -> str:
        return f"Attempt({self.spans}, exact={self.exact})"


def _without(spans: Spans, offset: int) -> tuple[Spans, Spans]:
    """``spans`` split around ``offset``: the spans before it and the spans after it."""
    before = tuple((start, min(stop, offset)) for start, stop in spans if start < offset)
    after = tuple((max(start, offset + 1), stop) for start, stop in spans if stop > offset + 1)
    return before, after


def _halves(spans: Spans, rows: int) -> tuple[Spans, Spans]:
    """``spans`` cut into two with half the rows each, the first half rounded down."""
    wanted, first, second = rows // 2, [], []
    for start, stop in spans:
        if wanted <= 0:
            second.append((start, stop))
        elif stop - start <= wanted:
            first.append((start, stop))
            wanted -= stop - start
        else:
            first.append((start, start + wanted))
            second.append((start + wanted, stop))
            wanted = 0
    return tuple(first), tuple(second)


class RowSearch:
    """
    The attempts that write every good row of a chunk of ``size`` rows and find each refused one.

    Ask :meth:`next` for an attempt, send its rows, and tell :meth:`loaded` or :meth:`refused`.

    1. The first attempt is the whole chunk.
    2. A refusal that names its row (PostgreSQL's ``COPY t, line N``) rejects that row. The rows
       before it are good: they are carried into the next attempt, which adds a window of new rows
       as long as the distance the refused row was found at, doubled after each attempt that passes.
       So each refused row costs one failed statement and about the rows since the one before. Rows
       carried over more than :data:`CARRY_WINDOWS` windows go alone first.
    3. A refusal that names no row (a foreign key checked at the end of the statement, MySQL, SQLite)
       is bisected: each half goes again alone, down to the single row to reject.
    4. The last ``alone`` rows of the chunk, rows set aside as likely to be refused (a key the table
       holds), go one by one after all the others.
    """

    __slots__ = ("_alone", "_carried", "_pending", "_position", "_size", "_window", "rejected", "sent")

    def __init__(self, size: int, alone: int = 0, *, sent: int = 0) -> None:
        #: The rows the scan covers; the last ``alone`` rows go one by one after them.
        self._size = size - alone
        self._alone = deque(Attempt(((at, at + 1),), exact=True) for at in range(self._size, size))
        #: Exact attempts still to make, before the scan goes on.
        self._pending: deque[Attempt] = deque()
        #: Rows the scan found good and has not written yet.
        self._carried: Spans = ()
        #: Where the scan's new rows start, and how many its next attempt adds.
        self._position = 0
        self._window = self._size
        #: The refused rows' offsets in the chunk, with what refused them, in the order found.
        self.rejected: list[tuple[int, Exception]] = []
        #: Rows sent over all attempts, from ``sent`` (an earlier search's): ``size`` if none is refused.
        self.sent = sent

    def next(self) -> Attempt | None:
        """The next attempt to make, or ``None`` once every row is written or rejected."""
        if self._pending:
            attempt = self._pending.popleft()
        elif self._position < self._size or self._carried:
            stop = min(self._size, self._position + self._window)
            new = ((self._position, stop),) if stop > self._position else ()
            attempt = Attempt(self._carried + new, exact=False)
        elif self._alone:
            attempt = self._alone.popleft()
        else:
            return None
        self.sent += attempt.rows
        return attempt

    @property
    def done(self) -> bool:
        """Whether every row is written or rejected: :meth:`next` would return None."""
        return not self._pending and not self._carried and self._position >= self._size and not self._alone

    def loaded(self, attempt: Attempt) -> None:
        """``attempt``'s rows were written."""
        if not attempt.exact:
            self._carried = ()
            self._position = max(self._position, attempt.spans[-1][1])
            self._window *= 2

    def refused(self, attempt: Attempt, error: Exception, offset: int | None) -> None:
        """
        ``attempt`` was refused for its data with ``error``; ``offset`` is the refused row's offset in
        the chunk, if the database named the row.
        """
        if offset is not None and any(start <= offset < stop for start, stop in attempt.spans):
            self.rejected.append((offset, error))
            before, after = _without(attempt.spans, offset)
            if attempt.exact:
                if before or after:
                    self._pending.appendleft(Attempt(before + after, exact=True))
                return
            new_start = self._position
            found_at = offset - new_start + 1 if offset >= new_start else 1
            # The named row need not be the first bad one (PostgreSQL's COPY checks unique keys when
            # it flushes its buffer of rows), so it may be a carried row: those after it stay carried.
            carried = before + tuple(
                (start, min(stop, new_start)) for start, stop in after if start < new_start
            )
            self._position = max(new_start, offset + 1)
            self._window = max(found_at, FIRST_WINDOW)
            self._carried = carried
            if sum(stop - start for start, stop in carried) > CARRY_WINDOWS * self._window:
                self._pending.append(Attempt(carried, exact=True))
                self._carried = ()
        elif attempt.rows == 1:
            self.rejected.append((attempt.spans[0][0], error))
            if not attempt.exact:
                self._carried, self._position = (), max(self._position, attempt.spans[-1][1])
        else:
            first, second = _halves(attempt.spans, attempt.rows)
            self._pending.extendleft((Attempt(second, exact=True), Attempt(first, exact=True)))
            if not attempt.exact:  # the scan goes on after the bisected rows
                self._carried, self._position = (), max(self._position, attempt.spans[-1][1])
