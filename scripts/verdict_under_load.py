"""Run the README's main job many times beside busy processes and count the verdicts.

    python scripts/verdict_under_load.py [RUNS] [BUSY_PROCESSES]

Defaults: 500 runs, one busy process per core (a fully loaded CPU). Every
run's exit status and final classification are counted; a report that is
not SAFE is kept under ``verdicts-under-load/`` with its JSON. Exits 1 when
the verdicts were not all the same. The busy processes stop with it.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

COMMAND = [sys.executable, "-m", "dataoad", "test", "examples/payment_timeout_after_commit.py"]


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        pass


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    busy = int(sys.argv[2]) if len(sys.argv) > 2 else (os.cpu_count() or 1)
    root = Path(__file__).resolve().parent.parent
    kept = root / "verdicts-under-load"
    stop = multiprocessing.Event()
    spinners = [
        multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(busy)
    ]
    for spinner in spinners:
        spinner.start()
    verdicts: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    try:
        for run in range(runs):
            done = subprocess.run(
                [*COMMAND, "--format", "json"],
                cwd=root,
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                classification = json.loads(done.stdout).get("classification", "?")
            except json.JSONDecodeError:
                classification = "unreadable report"
            verdict = f"exit {done.returncode}: {classification}"
            verdicts[verdict] += 1
            if done.returncode != 0:
                kept.mkdir(exist_ok=True)
                (kept / f"run-{run}.json").write_text(done.stdout + done.stderr)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(timeout=5)
    seconds = time.monotonic() - started
    print(f"{runs} runs beside {busy} busy process(es) in {seconds:.0f} s:")
    for verdict, count in verdicts.most_common():
        print(f"  {count:5d}  {verdict}")
    return 0 if len(verdicts) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
