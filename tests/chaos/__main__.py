"""
``python -m tests.chaos``: boundeddb's chaos soak (``nox -s chaos``; docs/how-to/contribute.md).

It starts a PostgreSQL of its own, a fault proxy in front of it (and of the local MariaDB, if one
answers), runs every workload and job through them for ``--duration`` seconds while the nemesis
injects a fault every 1-2 s, then heals the faults, lets every operation finish, and checks the
history against the databases. It prints the seed first (``--seed`` replays the same draws) and a
report at the end (``report.md`` and ``report.json`` in ``--out``). It exits 0 if it found no
anomaly, 1 if it found one, 2 if it cannot run here, and 3 if the soak itself failed (its
traceback is printed, and written to ``soak-error.txt``).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from tests.chaos.checker import EXAMPLES, Verdict, bank_anomalies, check
from tests.chaos.config import Config, default_jobs, default_workloads
from tests.chaos.jobs import JobSupervisor
from tests.chaos.nemesis import FAULTS, Nemesis
from tests.chaos.proxy import FaultProxy, ProxyLoop
from tests.chaos.records import Lines, read_all
from tests.chaos.sampler import Sampler
from tests.chaos.schema import create_bank, create_mysql, create_postgres
from tests.chaos.server import ChaosServer, server_available

MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306"
#: How long the clients and jobs may take to finish once the faults are healed.
SETTLE_S = 240.0
_ROOT = Path(__file__).resolve().parents[2]


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of faults (default 600)")
    parser.add_argument(
        "--seed", type=int, help="the seed of every random draw (default: a new one, printed)"
    )
    parser.add_argument(
        "--out", type=Path, help="the run's directory (default: a new one under the temp dir)"
    )
    parser.add_argument("--workloads", help="comma-separated workload names (default: all; 'none' for none)")
    parser.add_argument("--jobs", help="comma-separated job names: load, map, processes (default: all)")
    parser.add_argument("--faults", help=f"comma-separated faults (default: all of {', '.join(FAULTS)})")
    parser.add_argument(
        "--crash-every", type=float, default=90.0, help="seconds between crashes, about (default 90; 0: none)"
    )
    parser.add_argument("--no-mysql", action="store_true", help="leave MariaDB out even if it answers")
    parser.add_argument("--scale", type=float, default=1.0, help="the jobs' sizes, as a fraction (default 1)")
    parser.add_argument(
        "--wrong-client", action="store_true", help="add the wrong-retry client (the checker's test)"
    )
    return parser.parse_args(argv)


def _mysql_answers() -> bool:
    engine = create_engine(MYSQL_URL, poolclass=NullPool, connect_args={"connect_timeout": 2})
    try:
        with engine.connect():
            return True
    except Exception:
        return False
    finally:
        engine.dispose()


def _pick(names: str | None, available: list[Any]) -> list[Any]:
    if names is None:
        return available
    wanted = {name.strip() for name in names.split(",") if name.strip() and name.strip() != "none"}
    unknown = wanted - {item.name for item in available}
    if unknown:
        raise SystemExit(f"unknown names {sorted(unknown)}: choose among {[item.name for item in available]}")
    return [item for item in available if item.name in wanted]


class Soak:
    """One run of the soak: its servers, proxies, processes and threads, and its verdict."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed if args.seed is not None else random.randrange(2**32)
        self.rng = random.Random(self.seed)
        self.out: Path = args.out or Path(tempfile.mkdtemp(prefix=f"chaos-{self.seed}-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.verdict = Verdict()
        self.started = time.time()

    def run(self) -> int:
        reason = server_available()
        if reason is not None:
            print(f"chaos: cannot run: {reason}", file=sys.stderr)
            return 2
        print(f"chaos: seed {self.seed}, {self.args.duration:.0f} s, out {self.out}", flush=True)
        server = ChaosServer()
        loop = ProxyLoop()
        try:
            return self._run(server, loop)
        finally:
            loop.close()
            server.close()

    def _run(self, server: ChaosServer, loop: ProxyLoop) -> int:
        args = self.args
        database = "chaos"
        with server.admin.connect() as connection:
            connection.execute(text(f"CREATE DATABASE {database}"))
        direct = server.url.set(drivername="postgresql+psycopg", database=database)
        admin = create_engine(
            direct,
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={"application_name": "chaos-admin"},
        )
        create_postgres(admin)
        pg_proxy = FaultProxy(loop, server.socket, "postgresql", name="postgresql")
        use_mysql = not args.no_mysql and _mysql_answers()
        mysql_database = f"chaos_{self.seed}"
        mysql_admin: Engine | None = None
        mysql_proxy: FaultProxy | None = None
        if use_mysql:
            mysql_admin = create_engine(MYSQL_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")
            with mysql_admin.connect() as connection:
                connection.execute(text(f"DROP DATABASE IF EXISTS {mysql_database}"))
                connection.execute(text(f"CREATE DATABASE {mysql_database}"))
            create_mysql(create_engine(f"{MYSQL_URL}/{mysql_database}", poolclass=NullPool))
            mysql_proxy = FaultProxy(loop, ("127.0.0.1", 3306), "mysql", name="mysql")
        workloads = _pick(args.workloads, default_workloads(mysql=use_mysql))
        if args.wrong_client:
            from tests.chaos.config import Workload

            workloads.append(Workload("wrong-retry", "wrong-retry", "asyncpg", limit=4, callers=1))
        jobs = _pick(args.jobs, default_jobs(scale=args.scale))
        config = Config(
            out=self.out, seed=self.seed, pg_port=pg_proxy.port, pg_database=database,
            pg_direct_url=direct.render_as_string(hide_password=False), workloads=workloads, jobs=jobs,
            mysql_port=mysql_proxy.port if mysql_proxy else None,
            mysql_database=mysql_database if use_mysql else None,
        )  # fmt: skip
        create_bank(admin, config.bank_accounts, config.bank_total // config.bank_accounts)
        config.save()
        anomalies = Lines(self.out, "anomalies", "main")
        faults_log = Lines(self.out, "faults", "main")
        limits = {config.app(w.name): w.limit for w in workloads if not w.mysql and w.kind != "wrong-retry"}
        limits.update({config.app(j.name): j.limit for j in jobs})
        mysql_limit = sum(w.limit for w in workloads if w.mysql)
        sampler = Sampler(
            self.out, admin, limits, anomalies,
            mysql=(mysql_admin, mysql_database, mysql_limit) if mysql_admin is not None else None,
        )  # fmt: skip
        sampler.start()
        supervisors = {j.name: JobSupervisor(config, j, admin, anomalies, sampler.killed) for j in jobs}
        clients = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.clients", str(self.out / "config.json")], cwd=_ROOT
        )
        for supervisor in supervisors.values():
            supervisor.start()
        faults = [f.strip() for f in args.faults.split(",")] if args.faults else list(FAULTS)
        nemesis = Nemesis(
            random.Random(self.rng.random()), server, admin, pg_proxy, supervisors, faults_log, faults=faults,
            crash_every=args.crash_every,
            mysql=(mysql_proxy, mysql_admin, mysql_database) if mysql_proxy and mysql_admin else None,
        )  # fmt: skip
        nemesis.start()
        deadline = time.monotonic() + args.duration
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(60.0, left))
            if clients.poll() is not None:
                anomalies.write(kind="clients-died", detail=f"exit status {clients.returncode}")
                break
            print(
                f"chaos: {args.duration - max(0.0, deadline - time.monotonic()):.0f} s, "
                f"faults {sum(nemesis.counts.values())}",
                flush=True,
            )
        faults_done = time.monotonic()
        nemesis.stop()
        (self.out / "stop").touch()
        settled_by = time.monotonic() + SETTLE_S
        for supervisor in supervisors.values():
            supervisor.stop()
        for supervisor in supervisors.values():
            supervisor.join(settled_by)
        try:
            clients.wait(max(1.0, settled_by - time.monotonic()))
        except subprocess.TimeoutExpired:
            anomalies.write(kind="clients-stuck", detail=f"still running {SETTLE_S} s after stop")
            clients.send_signal(signal.SIGUSR1)  # every thread's stack, into clients.stacks
            time.sleep(1)
            clients.kill()
            clients.wait()
        if clients.returncode not in (0, None):
            anomalies.write(kind="clients-died", detail=f"exit status {clients.returncode}")
        sampler.stop()
        settle_s = time.monotonic() - faults_done
        self._verdict(config, admin, mysql_admin, sampler, nemesis, supervisors, loop)
        anomalies.close()
        faults_log.close()
        code = self._report(config, nemesis, supervisors, sampler, settle_s)
        admin.dispose()
        pg_proxy.close()
        if mysql_proxy is not None:
            mysql_proxy.close()
        if mysql_admin is not None:
            with mysql_admin.connect() as connection:
                connection.execute(text(f"DROP DATABASE IF EXISTS {mysql_database}"))
            mysql_admin.dispose()
        return code

    def _verdict(
        self,
        config: Config,
        admin: Engine,
        mysql_admin: Engine | None,
        sampler: Sampler,
        nemesis: Nemesis,
        supervisors: dict[str, JobSupervisor],
        loop: ProxyLoop,
    ) -> None:
        verdict = self.verdict
        present: dict[str, int] = {}
        with admin.connect() as connection:
            for table in ("chaos_writes", "chaos_transfers"):
                present.update(
                    (op, int(n))
                    for op, n in connection.execute(text(f"SELECT op, count(*) FROM {table} GROUP BY op"))
                )
            balances = dict(connection.execute(text("SELECT id, balance FROM chaos_accounts")).all())
            transfers = connection.execute(text("SELECT source, target, amount FROM chaos_transfers")).all()
        if mysql_admin is not None and config.mysql_database:
            with mysql_admin.connect() as connection:
                present.update(
                    (op, int(n))
                    for op, n in connection.execute(
                        text(f"SELECT op, count(*) FROM {config.mysql_database}.chaos_writes GROUP BY op")
                    )
                )
        check(read_all(self.out, "ops"), present, verdict)
        for problem in bank_anomalies(
            balances, transfers, config.bank_total // config.bank_accounts, config.bank_total
        ):
            verdict.add("bank", problem)
        for record in read_all(self.out, "anomalies"):
            if record["kind"] != "note":
                verdict.add(
                    record["kind"],
                    f"{record.get('job') or record.get('op') or ''} {record['detail']}".strip(),
                )
        for error in loop.errors:
            verdict.add("soak-error", f"the proxy's loop: {error}")
        if nemesis.error is not None:
            verdict.add("soak-error", f"the nemesis: {nemesis.error!r}")

    def _report(
        self,
        config: Config,
        nemesis: Nemesis,
        supervisors: dict[str, JobSupervisor],
        sampler: Sampler,
        settle_s: float,
    ) -> int:
        verdict = self.verdict
        totals: collections.Counter[str] = collections.Counter()
        for counts in verdict.ops.values():
            totals.update({k: v for k, v in counts.items() if k in ("ok", "fail", "info")})
        summary: dict[str, Any] = {
            "seed": self.seed,
            "duration_s": self.args.duration,
            "settle_s": round(settle_s, 1),
            "replay": f"python -m tests.chaos --seed {self.seed} --duration {self.args.duration:.0f}",
            "operations": dict(totals),
            "operations_by_workload": {w: dict(c) for w, c in sorted(verdict.ops.items())},
            "faults": dict(sorted(nemesis.counts.items())),
            "jobs": {
                name: {
                    "jobs_checked": s.jobs_checked,
                    "units_checked": s.units_checked,
                    "runs": s.runs,
                    "kills": s.kills,
                }
                for name, s in supervisors.items()
            },
            "samples": {
                "taken": sampler.samples,
                "checked": sampler.checked,
                "server_down": sampler.failed_samples,
            },
            "peak_backends": dict(sorted(sampler.peaks.items())),
            "anomalies": verdict.count,
            "anomalies_by_kind": {
                kind: {"count": len(found), "examples": [a.detail for a in found[:EXAMPLES]]}
                for kind, found in sorted(verdict.anomalies.items())
            },
        }
        (self.out / "report.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        lines = [
            f"# Chaos soak, seed {self.seed}",
            "",
            f"{self.args.duration:.0f} s of faults, then {settle_s:.0f} s to settle. "
            f"Replay: `{summary['replay']}`.",
            "",
            f"Operations: {sum(totals.values()):,} "
            f"({', '.join(f'{k} {v:,}' for k, v in sorted(totals.items()))}).",
            "",
            "| workload | ok | fail | info | info present | info absent |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for workload, counts in sorted(verdict.ops.items()):
            lines.append(
                f"| {workload} | {counts['ok']:,} | {counts['fail']:,} | {counts['info']:,} | "
                f"{counts['info-present']:,} | {counts['info-absent']:,} |"
            )
        lines += ["", "| job | jobs checked | units checked | runs | kills |", "|---|---:|---:|---:|---:|"]
        for name, s in supervisors.items():
            lines.append(f"| {name} | {s.jobs_checked} | {s.units_checked:,} | {s.runs} | {s.kills} |")
        lines += ["", "Faults: " + ", ".join(f"{k} {v}" for k, v in sorted(nemesis.counts.items())) + "."]
        lines += [
            "",
            f"Samples of the server's backends: {sampler.samples:,} taken, {sampler.checked:,} checked, "
            f"{sampler.failed_samples:,} while it was down; peaks: "
            + ", ".join(f"{app} {n}" for app, n in sorted(sampler.peaks.items()))
            + ".",
            "",
            f"**Anomalies: {verdict.count}**",
        ]
        for kind, found in sorted(verdict.anomalies.items()):
            lines += ["", f"- {kind}: {len(found)}"]
            lines += [f"  - {a.detail}" for a in found[:EXAMPLES]]
        (self.out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print("\n".join(lines), flush=True)
        return 1 if verdict.count else 0


def main(argv: list[str]) -> int:
    soak = Soak(_arguments(argv))
    try:
        return soak.run()
    except Exception:
        failure = traceback.format_exc()
        (soak.out / "soak-error.txt").write_text(failure, encoding="utf-8")
        print(f"chaos: the soak itself failed:\n{failure}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
