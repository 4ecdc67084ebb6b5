"""CPU time and memory of processes and threads, from /proc (Linux); None where it cannot be read."""

from __future__ import annotations

import os
import resource

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def stat_cpu_s(path: str) -> float | None:
    """utime + stime from a /proc ``stat`` file (a process's or one of its threads'), None if unreadable."""
    try:
        with open(path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process from /proc, None if it is not visible here."""
    return stat_cpu_s(f"/proc/{pid}/stat")


def thread_cpu_s(pid: int, tid: int) -> float | None:
    """utime + stime of one thread of process ``pid``, None if it is not visible here."""
    return stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")


def threads_cpu_s(pid: int) -> dict[int, float]:
    """utime + stime of every thread of process ``pid`` now (empty if it is not visible here)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return {}
    found = {tid: thread_cpu_s(pid, tid) for tid in tids}
    return {tid: cpu for tid, cpu in found.items() if cpu is not None}


def children_cpu_s() -> float:
    """utime + stime of this process's children that ended and were waited for (getrusage)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_rss() -> int:
    """This process's resident set size in bytes."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE
