"""What the tests read from the server's side: backends in pg_stat_activity, committed units, peaks."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.engine import Engine
from typing_extensions import Self


def backends(admin: Engine, app: str, *, state_like: str = "%") -> int:
    with admin.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = :app AND coalesce(state, '') LIKE :state"
                ),
                {"app": app, "state": state_like},
            ).scalar_one()
        )


def idle_in_transaction(admin: Engine, app: str) -> int:
    return backends(admin, app, state_like="idle in transaction%")


def terminate_backends(admin: Engine, app: str) -> None:
    with admin.connect() as connection:
        connection.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :app"),
            {"app": app},
        )


def committed_units(admin: Engine) -> list[int]:
    with admin.connect() as connection:
        return sorted(connection.execute(text("SELECT unit FROM items")).scalars())


class PeakSampler:
    """In a thread of its own, calls ``count()`` every 10 ms while open and keeps the peak."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._count())
            self.samples += 1
            self._stop.wait(0.01)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


class ActivitySampler(PeakSampler):
    """Counts the test's backends in pg_stat_activity from its own connection, every 10 ms."""

    QUERY = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = :app AND backend_type = 'client backend'"
    )

    def __init__(self, admin: Engine, app: str) -> None:
        super().__init__(self._backends)
        self._admin, self._app = admin, app

    def _backends(self) -> int:
        with self._admin.connect() as connection:
            return int(connection.execute(self.QUERY, {"app": self._app}).scalar_one())
