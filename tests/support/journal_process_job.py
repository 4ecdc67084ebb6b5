"""
A journalled ProcessRunner job, run as a child process by tests/faults/test_journal_process_kill.py,
which SIGKILLs it (its parent alone, or with its workers).

The job is ``ProcessRunner(url, limit=4, processes=2, errors="collect").map_sync(fn, range(items),
journal=Journal(job, key=int, table=...))``, its units and what it prints those of
tests/support/journal_kill.py; so a rerun after a kill must skip every item whose unit committed,
and run every other one once.

The spawned workers import the units by their module's name (``tests.support.journal_kill``): run it
as ``python -m tests.support.journal_process_job`` from the repository's root (or with the root on
``PYTHONPATH``).
"""

from __future__ import annotations

import sys

from sqlalchemy.engine import make_url

from boundeddb import ProcessRunner
from tests.support import journal_kill as shared


def main(argv: list[str]) -> None:
    args = shared.job_parser(__doc__).parse_args(argv)
    url = make_url(args.url)
    runner = ProcessRunner(
        url,
        limit=4,
        processes=2,
        errors="collect",
        engine_options=shared.engine_options(url.get_driver_name(), args.schema, args.app),
        batch=shared.batch_policy(args.batch),
    )
    fn = shared.unit(url, args.pause)
    journal = shared.journal(args.job, args.table)
    with runner:
        shared.say_started()
        report = runner.map_sync(fn, range(args.items), journal=journal)
    shared.say_report(report)


if __name__ == "__main__":
    main(sys.argv[1:])
