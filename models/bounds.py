"""The scenarios bounded exhaustive exploration covers, as plain data.

Each bound names scenarios: their contenders, the fault budget per run and
the crashes per run. ``python -m models`` explores them on the abstract
protocol; ``python -m stateful_tests.exhaustive`` on the real runner.
"""

from __future__ import annotations

from models.explore import ContenderPlan

__all__ = ["BOUNDS", "ESCAPE", "LEASE_BOUNDS", "LIFECYCLE_BOUNDS", "RETRYING"]

P = ContenderPlan
RETRYING, ESCAPE = "retry-failed", "retry-unknown (escape hatch)"

#: name -> [(scenario, contenders, fault budget per run, crashes per run)]
BOUNDS: dict[str, list[tuple[str, list[ContenderPlan], int, int]]] = {
    "default": [
        ("2 contenders, 1 key", [P("order-1"), P("order-1")], 1, 1),
        (
            "2 contenders, 1 key, retrying policy and no verifier",
            [P("order-1", policy=RETRYING), P("order-1", with_verifier=False)],
            1,
            1,
        ),
        ("2 contenders, 2 keys", [P("order-1"), P("order-2")], 1, 1),
        (
            "3 contenders, 1 key, one an operator's recovery",
            [P("order-1"), P("order-1"), P("order-1", kind="recover")],
            1,
            0,
        ),
        ("1 contender, 2 faults", [P("order-1")], 2, 1),
        ("1 contender, escape-hatch policy, 2 faults", [P("order-1", policy=ESCAPE)], 2, 0),
        (
            "an execute and an operator's release",
            [P("order-1"), P("order-1", kind="release")],
            1,
            1,
        ),
        (
            "a duplicate that waits for the claim holder",
            [P("order-1"), P("order-1", wait="wait 0 s")],
            1,
            1,
        ),
        (
            "1 contender, retrying policy, 3 faults",
            [P("order-1", policy=RETRYING, with_verifier=False)],
            3,
            0,
        ),
        (
            "3 contenders, 1 key, the same request written three ways",
            [
                P("order-1"),
                P("order-1", form="keys reversed"),
                P("order-1", form="amount as float"),
            ],
            0,
            0,
        ),
        # The largest, last: a planted bug is usually found before it.
        ("3 contenders, 2 keys", [P("order-1"), P("order-2"), P("order-1")], 1, 0),
    ],
}
BOUNDS["large"] = [
    *[(name, plans, faults + 1, 1) for name, plans, faults, _ in BOUNDS["default"]],
    (
        "3 contenders, 1 key, escape-hatch policy",
        [P("order-1", policy=ESCAPE), P("order-1"), P("order-1", kind="reconcile")],
        1,
        1,
    ),
]

#: Lease scenarios, explored on the abstract protocol only (the real runner's
#: leases are raced by the runner machine): name -> [(scenario, contenders,
#: fault budget, crashes, lease expiries)]. An expiry may happen at every
#: point of every interleaving: before a claim, while a holder is parked at
#: the provider (it becomes a zombie), between a takeover and its settlement.
LEASE_BOUNDS: dict[str, list[tuple[str, list[ContenderPlan], int, int, int]]] = {
    "default": [
        ("a holder and a taker, 1 key", [P("order-1"), P("order-1")], 0, 1, 1),
        (
            "a holder and a retrying taker with a verifier",
            [P("order-1"), P("order-1", policy=RETRYING)],
            1,
            0,
            1,
        ),
        (
            "a holder, a taker without a verifier, and a later duplicate",
            [P("order-1"), P("order-1", with_verifier=False), P("order-1")],
            0,
            0,
            2,
        ),
    ],
}
LEASE_BOUNDS["large"] = [
    *[
        (n, plans, faults + 1, 1, expiries)
        for n, plans, faults, _, expiries in LEASE_BOUNDS["default"]
    ]
]

#: Lifecycle scenarios, explored on the real runner only (the abstract model
#: has no lifecycle): a key freed by expiry (asked for exactly the age its
#: receipt has reached by the ledger's clock) or by an operator's reopen,
#: beside duplicates, in every order. name -> [(scenario, contenders, fault
#: budget per run, crashes per run)]; a fault here is also a provider's
#: decline, without which no receipt is FAILED and nothing may be reopened.
LIFECYCLE_BOUNDS: dict[str, list[tuple[str, list[ContenderPlan], int, int]]] = {
    "default": [
        (
            "an expiry beside a duplicate",
            [P("order-1"), P("order-1", kind="expire"), P("order-1")],
            0,
            0,
        ),
        (
            "a reopen racing an expiry",
            [
                P("order-1", with_verifier=False),
                P("order-1", kind="reopen"),
                P("order-1", kind="expire"),
            ],
            1,
            0,
        ),
    ],
}
LIFECYCLE_BOUNDS["large"] = [
    (name, plans, faults + 1, 1) for name, plans, faults, _ in LIFECYCLE_BOUNDS["default"]
]
