"""The report's "Post 004" section: /count and /ping per variant (the scenario: ``post-004``)."""

from __future__ import annotations

from ..measurement import Measurement
from ..scenarios.post004_ping_under_slow_requests import CONTROL_SLEEP_S, LIMIT, REQUESTS


def section(rows: list[Measurement]) -> list[str]:
    """The report's table: /count and /ping min/mean/max per variant."""

    def s(m: Measurement, key: str) -> str:
        value = m.extra.get(key)
        return "-" if value is None else f"{value:.2f}"

    out = [
        f"## Post 004: {REQUESTS} slow requests and {REQUESTS} /ping at once",
        "",
        "| variant | rows | /count min, s | /count mean, s | /count max, s | /ping min, s | /ping mean, s "
        "| /ping max, s | notes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for m in rows:
        out.append(
            f"| {m.label.removeprefix('post-004 ')} | {m.config.get('rows', 0):,} | {s(m, 'count_min_s')} | "
            f"{s(m, 'count_mean_s')} | {s(m, 'count_max_s')} | {s(m, 'ping_min_s')} | "
            f"{s(m, 'ping_mean_s')} | "
            f"{s(m, 'ping_max_s')} | {m.error or (f'{m.failed} failed' if m.failed else '')} |"
        )
    out += [
        "",
        f"control: `asyncio.sleep({CONTROL_SLEEP_S})` instead of a query; "
        f"inline: `AsyncSession` in the endpoint (aiosqlite, asyncpg with a pool of 20); offload: "
        f"`ThreadOffloadRunner(limit={LIMIT}).submit` (pysqlite, psycopg).  The query counts the "
        "unfinished todos whose title contains a 9.  Post 004 measured /ping at 12.4 s mean with "
        "inline AsyncSession on SQLite (100 requests each, an M2 laptop).",
        "",
    ]
    return out
