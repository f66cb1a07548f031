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
import time
import uuid

from benchmarks import _postgres as pg
from dataoad.testing._postgres_server import PostgresServer


async def asyncpg_rate(dsn: str, seconds: float) -> float:
    step, close = await pg.raw_floor(dsn)
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        await step(done)
        done += 1
    await close()
    return done / seconds


async def psycopg_rate(dsn: str, seconds: float) -> float:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    # psycopg's placeholders are positional in text order: body before id.
    claim = pg.CLAIM.replace("$1", "%s").replace("$2", "%s").replace("$3", "%s")
    start = pg.START.replace("$2", "%s").replace("$1", "%s")
    finish = pg.FINISH.replace("$2", "%s").replace("$1", "%s")
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        ident = uuid.uuid4().hex
        assert await (await conn.execute(claim, (ident, ident, pg.BODY))).fetchall()
        assert await (await conn.execute(start, (pg.BODY, ident))).fetchall()
        assert await (await conn.execute(finish, (pg.BODY, ident))).fetchall()
        done += 1
    await conn.close()
    return done / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with PostgresServer(durable=True) as server:
        for round_number in range(1, args.rounds + 1):
            a = asyncio.run(asyncpg_rate(server.dsn, args.seconds))  # creates the table
            floor = pg.pgbench_rate(server, server.dsn, max(1, int(args.seconds)))
            assert not isinstance(floor, str), floor
            p = asyncio.run(psycopg_rate(server.dsn, args.seconds))
            print(
                f"round {round_number}: pgbench {floor:8.0f} actions/s | "
                f"asyncpg {a:8.0f} ({a / floor:.0%}) | psycopg {p:8.0f} ({p / floor:.0%})"
            )


if __name__ == "__main__":
    main()
