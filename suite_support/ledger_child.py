"""A child process for the cross-process and crash tests of the durable ledgers.

``python -m suite_support.ledger_child contend LEDGER EFFECTS KEYS SEED``: execute one
action per key, in a shuffled order, and print a JSON summary. LEDGER is a
SQLite file path, or ``postgresql://...#TABLE`` for PostgresLedger with its
own pool on TABLE.

``python -m suite_support.ledger_child crash LEDGER EFFECTS POINT [SYNCHRONOUS]``: run one
action and kill this process with SIGKILL at the named protocol point
(``during_completion``: SQLite only). The runner's lease is
``$DATAOAD_CHILD_LEASE`` seconds (default 30).

``python -m suite_support.ledger_child sweep LEDGER EFFECTS``: settle every stale
claim with ``recover_stale`` and a verifier reading EFFECTS; print JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dataoad import (
    ActionInProgressError,
    ActionRunner,
    PostgresLedger,
    SQLiteLedger,
    VerificationResult,
)
from dataoad.testing import FaultyLedger

CRASH_POINTS = (
    "after_claim",
    "after_attempt_start",
    "after_external_commit",
    "before_completion",
    "during_completion",
)


def record_effect(effects: Path, key: str) -> None:
    # O_APPEND writes of one short line are atomic; fsync so SIGKILL cannot lose it.
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{key}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class EffectsVerifier:
    """Reads the external effects log; a dead worker can no longer commit."""

    def __init__(self, effects: Path) -> None:
        self.effects = effects

    def verify(self, receipt: object) -> VerificationResult:
        count = self.effects.read_text().split().count("order-1") if self.effects.exists() else 0
        if count:
            return VerificationResult.confirmed(verified_provider_reference="order-1")
        return VerificationResult.absent(verified_provider_reference="order-1", retry_safe=True)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def open_ledger(spec: str) -> Any:
    if spec.startswith("postgresql://"):
        dsn, table = spec.rsplit("#", 1)
        return PostgresLedger(dsn, table=table, min_size=1, max_size=2)
    return SQLiteLedger(spec)


async def contend(spec: str, effects: Path, keys: int, seed: int) -> dict[str, Any]:
    order = list(range(keys))
    random.Random(seed).shuffle(order)
    won = replayed = in_progress = 0
    started = time.monotonic()
    async with open_ledger(spec) as ledger:
        runner = ActionRunner(ledger)
        for n in order:
            key = f"k{n}"

            def op(key: str = key) -> str:
                record_effect(effects, key)
                return key

            try:
                result = await runner.execute("act", op, request={"n": n}, idempotency_key=key)
            except ActionInProgressError:
                in_progress += 1
                continue
            if result.replayed:
                replayed += 1
            else:
                won += 1
    return {
        "pid": os.getpid(),
        "won": won,
        "replayed": replayed,
        "in_progress": in_progress,
        "seconds": time.monotonic() - started,
    }


async def crash(spec: str, effects: Path, point: str, synchronous: str = "FULL") -> None:
    ledger = (
        open_ledger(spec)
        if spec.startswith("postgresql://")
        else SQLiteLedger(spec, synchronous=synchronous)  # type: ignore[arg-type]
    )
    faulty = FaultyLedger(ledger)
    calls: dict[str, int] = {}

    def on_call(method: str) -> None:
        calls[method] = calls.get(method, 0) + 1
        if point == "before_completion" and method == "record":
            die()

    async def arm_completion() -> None:
        # Kill from inside SQLite while the completion UPDATE is executing.
        conn = await ledger._connection()
        steps = 0

        def progress() -> int:
            nonlocal steps
            steps += 1
            if steps >= 20:
                die()
            return 0

        await conn.set_progress_handler(progress, 1)

    faulty.on_call = on_call
    original_claim = faulty.claim

    async def claim_then_maybe_die(receipt: Any, **lease: Any) -> Any:
        outcome = await original_claim(receipt, **lease)
        if point == "after_claim":
            die()
        return outcome

    faulty.claim = claim_then_maybe_die  # type: ignore[method-assign]

    async def op() -> str:
        if point == "after_attempt_start":
            die()
        record_effect(effects, "order-1")
        if point == "after_external_commit":
            die()
        if point == "during_completion":
            await arm_completion()
        return "done"

    lease = float(os.environ.get("DATAOAD_CHILD_LEASE", "30"))
    await ActionRunner(faulty, lease=lease, owner="worker").execute(
        "charge", op, request={"amount": 1}, idempotency_key="order-1", provider_reference="order-1"
    )
    raise SystemExit("the crash point was never reached")


async def sweep(spec: str, effects: Path) -> dict[str, Any]:
    """Another process's sweep: settle every stale claim, invoking nothing."""
    async with open_ledger(spec) as ledger:
        results = await ActionRunner(ledger, owner="sweeper").recover_stale(
            EffectsVerifier(effects)
        )
        pending = await ledger.receipts(pending=True)
    return {
        "settled": [[r.receipt.idempotency_key, r.status.value] for r in results],
        "pending": len(pending),
    }


def contend_in_processes(spec: str, effects: Path, keys: int, processes: int) -> list[Any]:
    """Parent side: run ``processes`` children of ``contend`` at once; their JSON summaries."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "suite_support.ledger_child", "contend", spec, str(effects)]
    children = [
        subprocess.Popen(
            [*command, str(keys), str(seed)],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(processes)
    ]
    summaries = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err
        summaries.append(json.loads(out))
    return summaries


def main(argv: list[str]) -> None:
    mode, spec, effects = argv[0], argv[1], Path(argv[2])
    if mode == "contend":
        print(json.dumps(asyncio.run(contend(spec, effects, int(argv[3]), int(argv[4])))))
    elif mode == "crash":
        asyncio.run(crash(spec, effects, argv[3], *argv[4:5]))
    elif mode == "sweep":
        print(json.dumps(asyncio.run(sweep(spec, effects))))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
