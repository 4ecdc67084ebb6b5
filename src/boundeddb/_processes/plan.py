"""
The checks of a ProcessRunner's arguments, made before any worker starts, and each worker's settings.

They cover its budget, its workers and ``fn``.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from collections.abc import Mapping
from functools import partial
from typing import Any

from sqlalchemy.engine import URL, make_url

from .._arguments import check_retry, check_timeout, check_verify_commits
from .._autolimit import check_positive_int
from .._batch import check_batch
from .._dialects import for_name
from .backends import Backend, DaskCluster, LocalProcesses
from .protocol import Kind, WorkerConfig

__all__ = ["Plan", "check_driver", "check_fn"]


#: Engine options a ProcessRunner sets itself: each worker's pool is exactly its share of the limit.
_POOL_OPTIONS = ("pool_size", "max_overflow")


def _check_url(url: object) -> URL:
    if not isinstance(url, (str, URL)):
        msg = (
            f"url must be a database URL (str or sqlalchemy.engine.URL), got {type(url).__name__}: "
            "workers build their own engines from it, e.g. 'postgresql+asyncpg://user@host/db'"
        )
        raise TypeError(msg)
    parsed = make_url(url)
    parsed.get_dialect()  # an unknown database or driver fails here, in this process
    return parsed


def _check_engine_options(options: object) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        msg = f"engine_options must be a dict of create_engine() arguments, got {type(options).__name__}"
        raise TypeError(msg)
    taken = sorted(name for name in _POOL_OPTIONS if name in options)
    if taken:
        msg = (
            f"engine_options must not set {', '.join(taken)}: each worker's pool is exactly its share of "
            "limit (pool_size=share, max_overflow=0). Remove it and size the budget with limit="
        )
        raise ValueError(msg)
    try:
        pickle.dumps(dict(options))
    except Exception as error:
        msg = (
            f"engine_options must be picklable, to send them to the worker processes ({error}): "
            "pass module-level functions and plain values, not lambdas or open objects"
        )
        raise TypeError(msg) from None
    return dict(options)


def check_fn(fn: object) -> tuple[Kind, bytes]:
    """Whether ``fn`` is async, and its pickle, if workers can import it by name."""
    if not callable(fn):
        msg = f"fn must be callable as fn(session, item), got {fn!r}: pass a module-level function"
        raise TypeError(msg)
    target: Any = fn
    while isinstance(target, partial):
        target = target.func
    qualname = getattr(target, "__qualname__", "")
    if qualname == "<lambda>" or "<locals>" in qualname:
        kind = "a lambda" if qualname == "<lambda>" else f"a local function ({qualname})"
        msg = (
            f"fn must be a module-level function: workers import it by name, and {kind} has none. "
            "Define it at the top level of a module (a functools.partial of one is fine)"
        )
        raise TypeError(msg)
    try:
        data = pickle.dumps(fn, pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        msg = (
            f"fn must be picklable: workers import it by name ({type(error).__qualname__}: {error}). "
            "Pass a module-level function, or a functools.partial of one with picklable arguments"
        )
        raise TypeError(msg) from None
    # A function, a partial of one, or an object whose __call__ is async.
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(target).__call__)
    return (Kind.ASYNC if is_async else Kind.SYNC), data


def check_driver(kind: Kind, url: URL) -> None:
    """A function of ``kind`` needs a driver of its kind: an async one for ``async def``, else a sync one."""
    driver = url.get_driver_name()
    if kind is Kind.ASYNC and not url.get_dialect(_is_async=True).is_async:
        msg = (
            f"fn is an async def, but the driver of url ({driver}) is sync: pass a plain def fn, or a URL "
            "with an async driver (postgresql+asyncpg, postgresql+psycopg, mysql+aiomysql)"
        )
        raise TypeError(msg)
    if kind is Kind.SYNC and url.get_dialect().is_async:
        msg = (
            f"fn is a plain def, but the driver of url ({driver}) is async only: pass an async def fn, or a "
            "URL with a sync driver (postgresql+psycopg, postgresql+psycopg2, mysql+pymysql)"
        )
        raise TypeError(msg)


def _shares(limit: int, processes: int) -> list[int]:
    """``limit`` split over ``processes`` as evenly as it goes: the first ones take one more."""
    base, extra = divmod(limit, processes)
    return [base + (1 if number < extra else 0) for number in range(processes)]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A ProcessRunner's arguments, checked: its budget, its workers' settings and how they start."""

    url: URL
    limit: int
    processes: int
    verify: bool
    backend: Backend
    configs: list[WorkerConfig]

    @classmethod
    def of(
        cls,
        url: object,
        limit: object,
        processes: object,
        engine_options: object,
        retry: object,
        timeout: object,
        verify_commits: object,
        cluster: object,
        batch: object = None,
    ) -> Plan:
        """Check every argument before any worker starts, each error naming it and the fix."""
        parsed = _check_url(url)
        checked_batch = check_batch(batch)
        budget = check_positive_int(
            "limit", limit, hint="pass the connection budget of all workers, e.g. limit=8"
        )
        checked_retry = None if retry is None else check_retry(retry)
        if checked_retry is not None:
            try:
                pickle.dumps(checked_retry)
            except Exception as error:
                msg = (
                    f"retry must be picklable, to send it to the workers ({error}): "
                    "give retry_on a module-level function"
                )
                raise TypeError(msg) from None
        name = parsed.get_dialect().name
        verify = check_verify_commits(verify_commits, for_name(name), name)
        options = _check_engine_options(engine_options)
        seconds = check_timeout(timeout)
        if cluster is not None and not (hasattr(cluster, "submit") and hasattr(cluster, "scheduler_info")):
            msg = f"cluster must be a distributed.Client (Dask) or None, got {type(cluster).__name__}"
            raise TypeError(msg)
        backend: Backend = LocalProcesses() if cluster is None else DaskCluster(cluster)
        if processes is None:
            processes = min(backend.default_workers(), budget)
        workers = check_positive_int(
            "processes", processes, hint="pass how many worker processes, e.g. processes=2"
        )
        if workers > budget:
            backend.close()
            msg = (
                f"processes={workers} is more than limit={budget}: each worker needs at least one "
                f"connection of the budget. Pass processes <= {budget}, or a larger limit"
            )
            raise ValueError(msg)
        configs = [
            WorkerConfig(parsed, options, share, checked_retry, seconds, verify, checked_batch)
            for share in _shares(budget, workers)
        ]
        return cls(parsed, budget, workers, verify, backend, configs)
