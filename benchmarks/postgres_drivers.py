"""``python -m benchmarks.postgres_drivers``: which async PostgreSQL driver to build on.

The same three statements PostgresLedger runs per action (claim insert,
attempt-start update, completion update), each a single autocommit
statement, on one connection, against one throwaway server (fsync on):
pgbench with a custom script (a C client, the floor), asyncpg and psycopg 3.
Prints each driver's rate as a fraction of pgbench's.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import tempfile
import time
import uuid

from dataoad.testing._postgres_server import PostgresServer

SCHEMA = """
DROP TABLE IF EXISTS bench;
CREATE TABLE bench (
    id text PRIMARY KEY, name text NOT NULL, key text NOT NULL,
    state text NOT NULL, version integer NOT NULL, body text NOT NULL,
    UNIQUE (name, key)
);
"""
CLAIM = (
    "INSERT INTO bench (id, name, key, state, version, body) VALUES ($1, 'charge', $2, "
    "'PENDING', 1, $3) ON CONFLICT (name, key) DO NOTHING RETURNING id"
)
START = "UPDATE bench SET version = 2, body = $2 WHERE id = $1 AND version = 1 RETURNING id"
FINISH = (
    "UPDATE bench SET version = 3, state = 'COMPLETED', body = $2 WHERE id = $1 "
    "AND version = 2 RETURNING id"
)
BODY = '{"attempts":[{"number":1,"started_at":"2026-11-30T00:00:00+00:00"}]}'


def pgbench_rate(server: PostgresServer, seconds: int) -> float:
    script = (
        "\\set k random(1, 1000000000)\n"
        + CLAIM.replace("$1", "'p' || :client_id || '-' || :k")
        .replace("$2", "'k' || :client_id || '-' || :k")
        .replace("$3", f"'{BODY}'")
        + ";\n"
        + START.replace("$1", "'p' || :client_id || '-' || :k").replace("$2", f"'{BODY}'")
        + ";\n"
        + FINISH.replace("$1", "'p' || :client_id || '-' || :k").replace("$2", f"'{BODY}'")
        + ";\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(script)
    result = subprocess.run(
        [
            str(server.bindir / "pgbench"),
            "-n",
            "-c",
            "1",
            "-T",
            str(seconds),
            "-M",
            "prepared",
            "-f",
            handle.name,
            server.dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    assert match, result.stdout
    return float(match.group(1))


async def asyncpg_rate(dsn: str, seconds: float) -> float:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        ident = uuid.uuid4().hex
        assert await conn.fetch(CLAIM, ident, ident, BODY)
        assert await conn.fetch(START, ident, BODY)
        assert await conn.fetch(FINISH, ident, BODY)
        done += 1
    await conn.close()
    return done / seconds


async def psycopg_rate(dsn: str, seconds: float) -> float:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    # psycopg's placeholders are positional in text order: body before id.
    claim = CLAIM.replace("$1", "%s").replace("$2", "%s").replace("$3", "%s")
    start = START.replace("$2", "%s").replace("$1", "%s")
    finish = FINISH.replace("$2", "%s").replace("$1", "%s")
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        ident = uuid.uuid4().hex
        assert await (await conn.execute(claim, (ident, ident, BODY))).fetchall()
        assert await (await conn.execute(start, (BODY, ident))).fetchall()
        assert await (await conn.execute(finish, (BODY, ident))).fetchall()
        done += 1
    await conn.close()
    return done / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with PostgresServer(durable=True) as server:
        subprocess.run(
            [str(server.bindir / "psql"), server.dsn, "-q", "-c", SCHEMA],
            check=True,
            capture_output=True,
        )
        for round_number in range(1, args.rounds + 1):
            floor = pgbench_rate(server, max(1, int(args.seconds)))
            a = asyncio.run(asyncpg_rate(server.dsn, args.seconds))
            p = asyncio.run(psycopg_rate(server.dsn, args.seconds))
            print(
                f"round {round_number}: pgbench {floor:8.0f} actions/s | "
                f"asyncpg {a:8.0f} ({a / floor:.0%}) | psycopg {p:8.0f} ({p / floor:.0%})"
            )


if __name__ == "__main__":
    main()
