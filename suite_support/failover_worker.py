"""One worker of the failover test: first calls and duplicates over a moving key set.

``python -m suite_support.failover_worker CONFIG.json N``: runs until the config's stop
file exists (or its deadline, a cap) through the multi-host DSN (or PgBouncer), charging
the file-backed provider, and writes one JSON line per finished call (result or error) to
``out-N.jsonl``.
A call refused while the primary is down is tried again after a pause.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, DataoadError, PostgresLedger
from suite_support.payments_file import FilePayments


async def main(config_path: str, number: int) -> None:
    config = json.loads(Path(config_path).read_text())
    payments = FilePayments(config["payments"])
    ledger = PostgresLedger(
        config["dsn"],
        min_size=1,
        max_size=2,
        command_timeout=3,
    )  # behind PgBouncer it finds the pooler itself
    runner = ActionRunner(ledger, lease=config["lease"], owner=f"worker-{number}")
    rng = random.Random(number)
    out = Path(config["folder"]) / f"out-{number}.jsonl"
    stop = Path(config["stop"])
    with out.open("w") as log:
        while time.time() < config["deadline"] and not stop.exists():
            # New keys keep coming (a few each 200 ms, shared by every worker), so
            # first calls are in flight when the primary dies, and each has duplicates.
            # Duplicates also reach back 3 s, across the failover.
            bucket = max(0, int((time.time() - config["start"]) * 5) - rng.randrange(15))
            key = f"k{bucket}-{rng.randrange(config['keys'])}"

            def charge(key: str = key) -> str:
                return payments.charge(key, 100)

            entry: dict[str, Any] = {"key": key, "worker": number}
            try:
                result = await runner.execute(
                    "charge",
                    charge,
                    request={"key": key},
                    idempotency_key=key,
                    provider_reference=key,
                    verifier=payments.verify,
                    wait_in_progress=config["lease"] * 3,
                )
                entry.update(
                    status=result.status.value,
                    action_id=result.receipt.action_id,
                    replayed=result.replayed,
                )
            except DataoadError as exc:
                entry.update(
                    error=type(exc).__name__, invoked=getattr(exc, "operation_invoked", None)
                )
                await asyncio.sleep(0.2)
            except OSError as exc:
                entry.update(error=type(exc).__name__)
                await asyncio.sleep(0.2)
            entry["at"] = time.time()
            log.write(json.dumps(entry) + "\n")
            log.flush()
    await ledger.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
