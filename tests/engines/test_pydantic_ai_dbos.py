"""Pydantic AI's DBOS-durable agent (``DBOSAgent``, the real packages): a Dataoad-guarded
tool, the agent's worker killed at every point of the tool's step, DBOS's recovery running
the agent again with the model's answers replayed from its checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engines.crash_harness import crash_matrix, run_crash
from tests.engines.ledger_view import stored_receipts

WORKER = "tests.engines.pydantic_dbos_worker"


@pytest.mark.parametrize(("point", "verifier"), crash_matrix())
def test_guarded_tool_of_a_durable_agent_killed_and_recovered(
    tmp_path: Path, point: str, verifier: bool, dbos_system_database: str
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        point,
        mode="guarded",
        verifier=verifier,
        system_database=dbos_system_database,
    )
    assert run.killed, f"the worker never reached {point}"
    assert len(run.charges) <= 1, f"charged {len(run.charges)} times: {run.charges}"
    (receipt,) = stored_receipts(tmp_path / "ledger.sqlite3")
    assert receipt.idempotency_key.startswith("dbos:checkout-1:")
    assert not receipt.is_pending
    assert receipt.final_status is not None
    status = receipt.final_status.value
    if verifier or point in ("before_claim", "after_outcome"):
        assert status == "CONFIRMED"
        assert len(run.charges) == 1
        # The model read the evidence, with the action id the receipt has.
        assert run.outcome["answer"].startswith("tool said: CONFIRMED")
        assert receipt.action_id in run.outcome["answer"]
    else:
        assert run.outcome == {"outcome": "unresolved", "receipt": "UNKNOWN"}
        assert status == "UNKNOWN"


def test_without_dataoad_the_durable_agent_charges_twice(
    tmp_path: Path, record_property: Callable[[str, object], None], dbos_system_database: str
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        "after_commit",
        mode="plain",
        verifier=False,
        system_database=dbos_system_database,
    )
    assert run.killed
    assert len(run.charges) == 2, run.charges
    record_property(
        "without_dataoad",
        f"Pydantic AI DBOSAgent, plain tool, killed after the provider committed: "
        f"{len(run.charges)} charges",
    )


def test_a_guarded_tool_of_an_agent_whose_tool_calls_run_in_parallel_is_refused(
    tmp_path: Path, dbos_system_database: str
) -> None:
    """Parallel tool calls start their DBOS steps in an order set by timing: on recovery a
    step's key could pass to another call (a second charge). Refused, nothing recorded."""
    run = run_crash(
        WORKER,
        tmp_path,
        "never",
        mode="guarded",
        verifier=True,
        parallel=True,
        system_database=dbos_system_database,
    )
    assert run.outcome["outcome"] == "refused", run.outcome
    assert "parallel_execution_mode='sequential'" in run.outcome["error"]
    assert "nothing was recorded or invoked" in run.outcome["error"]
    assert run.charges == []
    ledger = tmp_path / "ledger.sqlite3"
    assert not ledger.exists() or stored_receipts(ledger) == []  # never even opened
