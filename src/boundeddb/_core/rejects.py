"""
Which rows of a chunk the database refuses: the search that ``load()`` runs inside each chunk's
transaction, one savepoint per attempt, without I/O of its own.

:doc:`/explanation/loads` tells the algorithm and what it costs.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["FIRST_WINDOW", "Attempt", "RowSearch"]

#: The fewest rows an attempt after a refused row sends while the search scans on.
FIRST_WINDOW: Final = 8


class Attempt:
    """Rows ``start`` to ``stop`` of a chunk, sent in one statement; ``exact`` if the search knows its end."""

    __slots__ = ("exact", "start", "stop")

    def __init__(self, start: int, stop: int, *, exact: bool) -> None:
        self.start = start
        self.stop = stop
        self.exact = exact

    def __repr__(self) -> str:
        return f"Attempt({self.start}, {self.stop}, exact={self.exact})"


class RowSearch:
    """
    The attempts that write every good row of a chunk of ``size`` rows and find each refused one.

    Ask :meth:`next` for an attempt, send its rows, and tell :meth:`loaded` or :meth:`refused`.

    1. The first attempt is the whole chunk.
    2. A refusal that names its row (PostgreSQL's ``COPY t, line N``) rejects that row; the rows
       before it go again as one exact attempt, and the scan goes on after it with a window as long
       as the distance the refused row was found at, doubled after each attempt that passes. So a
       bad row costs about the rows since the last one, not the whole rest of the chunk.
    3. A refusal that names no row (a foreign key checked at the end of the statement, MySQL, SQLite)
       is bisected: each half goes again alone, down to the single row to reject.
    """

    __slots__ = ("_pending", "_position", "_size", "_window", "rejected", "sent")

    def __init__(self, size: int) -> None:
        self._size = size
        #: Exact attempts still to make, before the scan goes on.
        self._pending: deque[Attempt] = deque()
        #: Where the scan goes on, and the rows its next attempt sends.
        self._position = 0
        self._window = size
        #: The refused rows' offsets in the chunk, with what refused them, in the order found.
        self.rejected: list[tuple[int, Exception]] = []
        #: Rows sent over all attempts: ``size`` when no row is refused.
        self.sent = 0

    def next(self) -> Attempt | None:
        """The next attempt to make, or ``None`` once every row is written or rejected."""
        if self._pending:
            attempt = self._pending.popleft()
        elif self._position < self._size:
            stop = min(self._size, self._position + self._window)
            attempt = Attempt(self._position, stop, exact=False)
            self._position = stop
        else:
            return None
        self.sent += attempt.stop - attempt.start
        return attempt

    def loaded(self, attempt: Attempt) -> None:
        """``attempt``'s rows were written."""
        if not attempt.exact:
            self._window *= 2

    def refused(self, attempt: Attempt, error: Exception, line: int | None) -> None:
        """
        ``attempt`` was refused for its data with ``error``; ``line`` is the refused row's position in
        the attempt, from 1, if the database said.
        """
        start, stop = attempt.start, attempt.stop
        if line is not None and 1 <= line <= stop - start:
            bad = start + line - 1
            self.rejected.append((bad, error))
            then = []
            if bad > start:
                then.append(Attempt(start, bad, exact=True))
            if attempt.exact:
                if bad + 1 < stop:
                    then.append(Attempt(bad + 1, stop, exact=True))
            else:  # the scan goes on after the refused row
                self._position = bad + 1
                self._window = max(line, FIRST_WINDOW)
            self._pending.extendleft(reversed(then))
        elif stop - start == 1:
            self.rejected.append((start, error))
        else:
            middle = (start + stop) // 2
            self._pending.extendleft((Attempt(middle, stop, exact=True), Attempt(start, middle, exact=True)))
