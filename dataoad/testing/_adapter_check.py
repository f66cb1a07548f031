"""The adapter-contract state machine behind ``dataoad check``.

Hypothesis drives the real ActionRunner over a user's ProviderAdapter:
concurrent contenders for the same keys, faults on both sides of the
provider's commit (staged in the sandbox, or injected around ``perform``),
verifier outages and bad reads, in-flight requests that land later, and
read-only reconciliation. After every step the receipts and every verifier
answer are checked against the adapter's oracle. A violation is shrunk and
reported as a numbered trace in words.
"""

from __future__ import annotations

import asyncio
import time
import unittest
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar, cast

from dataoad._errors import DataoadError, MissingExtraError

try:
    from hypothesis import note, seed
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        invariant,
        rule,
        run_state_machine_as_test,
    )
except ImportError as exc:
    raise MissingExtraError.for_extra(
        "dataoad's adapter checker (check_adapter, adapter_test_case, dataoad check)",
        "Hypothesis",
        "testing",
    ) from exc

from dataoad._failure import DefinitiveFailure
from dataoad._policy import RetryPolicy
from dataoad._receipt import ActionReceipt
from dataoad._runner import ActionRunner
from dataoad._status import ActionStatus, VerificationHealth
from dataoad._verification import VerificationResult
from dataoad.ledgers.memory import InMemoryLedger
from dataoad.testing._adapter import ProviderAdapter, ReadFault, SandboxFault
from dataoad.testing._adapter_budget import PROFILES, search_settings
from dataoad.testing._adapter_faults import label as _label
from dataoad.testing._adapter_faults import supported as _supported
from dataoad.testing._adapter_report import (
    INVARIANTS,
    AdapterCheckReport,
    AdapterViolation,
    describe_answer,
    describe_outcome,
    describe_receipt,
    shown,
    write_html,
    write_json,
    write_junit,
)
from dataoad.testing._adapter_watch import CallWatch

__all__ = [
    "INVARIANTS",
    "AdapterCheckReport",
    "AdapterViolation",
    "adapter_test_case",
    "check_adapter",
    "write_html",
    "write_json",
    "write_junit",
]

KEYS = ("order-1", "order-2")
#: Faults the checker injects around ``perform`` itself (no sandbox needed).
AROUND_PERFORM = ("none", "raise before sending", "lose the response after perform returns")
#: Faults the checker injects around ``verify`` itself.
AROUND_VERIFY = ("none", "verifier outage")

T = TypeVar("T")

POLICIES = {
    "default": RetryPolicy(),
    "retry-failed": RetryPolicy(max_attempts=3, retry_on_failed=True),
}


class AdapterMachine(RuleBasedStateMachine):
    """Contenders, faults and reconciliation over one adapter; see the module docstring."""

    adapter: ClassVar[ProviderAdapter]
    sandbox_faults: ClassVar[list[str]] = []
    read_faults: ClassVar[list[str]] = []
    examples: ClassVar[int] = 0
    #: Seconds a perform or verify call may take before it is a violation.
    call_timeout: ClassVar[float] = 10.0
    #: Set once a violation was found: every later example is shrinking it.
    found: ClassVar[bool] = False
    progress: ClassVar[Callable[[str], None] | None] = None
    #: The command line's watch over calls no timer of the loop can end.
    watch: ClassVar[CallWatch | None] = None

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        if type(self).watch is not None:
            type(self).watch.examples = type(self).examples  # type: ignore[union-attr]
        report = type(self).progress
        if report is not None:
            phase = "shrinking the counterexample" if type(self).found else "searching"
            report(f"{phase}: {type(self).examples} examples tried")
        self.adapter.reset()
        self.loop = asyncio.Runner()
        self.ledger = InMemoryLedger()
        self.steps: list[dict[str, Any]] = []
        self.problems: list[tuple[str, str]] = []
        self.read_fault_staged = False
        self.names = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 4)

    def teardown(self) -> None:
        self.loop.close()

    # -- bookkeeping -------------------------------------------------------------------

    def _reference(self, key: str) -> str:
        return f"ref-{key}"

    def _provider_state(self, key: str) -> str:
        ref = self._reference(key)
        effects = self.adapter.effects(ref)
        flight = ", a request in flight" if self.adapter.in_flight(ref) else ""
        return f"{ref} has {effects} effect{'s' if effects != 1 else ''}{flight}"

    def _step(self, actor: str, text: str, key: str | None, answers: Sequence[str] = ()) -> None:
        entry: dict[str, Any] = {"number": len(self.steps) + 1, "actor": actor, "text": text}
        if answers:
            entry["verifier"] = "; ".join(answers)
        if key is not None:
            entry["provider"] = self._provider_state(key)
            stored = self.loop.run(self.ledger.find(self.adapter.action_name, key))
            entry["ledger"] = describe_receipt(stored)
        self.steps.append(entry)
        note(f"{entry['number']}. {actor}: {text}")

    def _problem(self, name: str, detail: str) -> None:
        self.problems.append((name, detail))

    # -- wrappers that inject faults and watch each call ---------------------------------

    def _operation(self, key: str, fault: str) -> Callable[[], Any]:
        ref = self._reference(key)
        request = self.adapter.request_for(key)

        async def operation() -> Any:
            if fault == "raise before sending":
                raise ConnectionError("injected: the request never left the client")
            if fault in SandboxFault.__members__:
                self.adapter.stage_sandbox_fault(SandboxFault[fault])
            before = self.adapter.effects(ref)
            try:
                value = await self._within_timeout(
                    "perform", ref, self.adapter.perform(dict(request), ref)
                )
            except DefinitiveFailure:
                after = self.adapter.effects(ref)
                if after > before or self.adapter.in_flight(ref):
                    self._problem(
                        "definitive-failure-only-when-nothing-committed",
                        f"perform raised DefinitiveFailure for {ref}, yet the provider went "
                        f"from {before} to {after} effects"
                        + (" with a request in flight" if self.adapter.in_flight(ref) else ""),
                    )
                raise
            if fault == "lose the response after perform returns":
                raise TimeoutError("injected: the response was lost")
            return value

        return operation

    def _verifier(self, read: str, answers: list[str]) -> Callable[[ActionReceipt], Any]:
        async def verify(receipt: ActionReceipt) -> VerificationResult:
            if read == "verifier outage":
                answers.append("raised ConnectionError: the read path is down (injected)")
                raise ConnectionError("injected: the verifier's read path is down")
            staged = read in ReadFault.__members__
            if staged:
                self.adapter.stage_read_fault(ReadFault[read])
            try:
                ref = receipt.provider_reference
                result = await self._within_timeout("verify", ref, self.adapter.verify(receipt))
            except BaseException as exc:
                answers.append(describe_answer(exc))
                raise
            answers.append(describe_answer(result))
            self._judge(receipt, result, staged)
            return result

        return verify

    async def _within_timeout(self, call: str, ref: str | None, awaitable: Awaitable[T]) -> T:
        timer = asyncio.timeout(self.call_timeout)
        began = time.monotonic()
        watch = type(self).watch
        if watch is not None:
            watch.started(call, ref, self.steps)
        try:
            async with timer:
                return await awaitable
        except TimeoutError:
            # Only the checker's own timer: a TimeoutError the adapter raises
            # itself (its sandbox's timeout fault) is the call's answer.
            if timer.expired():
                self._late(call, ref)
            raise
        finally:
            if watch is not None:
                watch.ended()
            # A call that blocked the loop, or swallowed the timer's
            # cancellation, returns late without a TimeoutError.
            if not timer.expired() and time.monotonic() - began > self.call_timeout:
                self._late(call, ref)

    def _late(self, call: str, ref: str | None) -> None:
        self._problem(
            "calls-return-within-the-call-timeout",
            f"{call} for {ref} had not returned after {self.call_timeout:g} s",
        )

    def _judge(self, receipt: ActionReceipt, result: object, staged: bool) -> None:
        if not isinstance(result, VerificationResult):
            return  # the runner records a malformed answer as UNKNOWN
        ref = receipt.provider_reference
        assert ref is not None
        healthy = result.health is VerificationHealth.HEALTHY
        bound = result.verified_provider_reference == ref
        effects = self.adapter.effects(ref)
        flight = self.adapter.in_flight(ref)
        decided = result.outcome is not ActionStatus.UNKNOWN
        if healthy and not staged and not bound and decided:
            named = result.verified_provider_reference
            self._problem(
                "verifier-names-the-receipts-reference",
                f"asked about {ref} with no read fault staged, the verifier answered "
                f"{result.outcome.value} "
                + ("naming no reference" if named is None else f"for {shown(repr(named))}"),
            )
        if not (healthy and bound):
            return
        if result.outcome is ActionStatus.CONFIRMED and effects == 0:
            self._problem(
                "confirmed-only-with-the-effect",
                f"the verifier confirmed {ref}, but the provider holds no effect for it",
            )
        if (
            result.outcome is ActionStatus.FAILED
            and result.conclusive_absence
            and result.retry_safe
            and (effects or flight)
        ):
            self._problem(
                "retry-safe-absence-only-when-final",
                f"the verifier said {ref} is absent and retry-safe"
                + (" after a staged read fault" if staged else "")
                + f", but the provider holds {effects} effect(s)"
                + (" and a request in flight" if flight else ""),
            )

    # -- rules ---------------------------------------------------------------------------

    def _fault_names(self) -> list[str]:
        return [*AROUND_PERFORM, *self.sandbox_faults]

    def _read_names(self) -> list[str]:
        return [*AROUND_VERIFY, *self.read_faults]

    @rule(data=st.data(), key=st.sampled_from(KEYS), policy=st.sampled_from(sorted(POLICIES)))
    def contenders_execute(self, data: st.DataObject, key: str, policy: str) -> None:
        """One to three contenders execute the same key at once, each with its own faults."""
        plans = data.draw(
            st.lists(
                st.tuples(
                    st.sampled_from(self._fault_names()), st.sampled_from(self._read_names())
                ),
                min_size=1,
                max_size=3,
            ),
            label="contenders (provider fault, read)",
        )
        # The checker times each verify call itself (``call_timeout``).
        runner = ActionRunner(self.ledger, policy=POLICIES[policy], verifier_timeout=None)
        names = [next(self.names) for _ in plans]
        answers: list[list[str]] = [[] for _ in plans]

        async def run_all() -> list[Any]:
            outcomes: list[Any] = await asyncio.gather(
                *(
                    runner.execute(
                        self.adapter.action_name,
                        self._operation(key, fault),
                        request=self.adapter.request_for(key),
                        idempotency_key=key,
                        provider_reference=self._reference(key),
                        verifier=self._verifier(read, heard),
                    )
                    for (fault, read), heard in zip(plans, answers, strict=True)
                ),
                return_exceptions=True,
            )
            return outcomes

        outcomes = self.loop.run(run_all())
        for name, (fault, read), outcome, heard in zip(
            names, plans, outcomes, answers, strict=True
        ):
            self._step(
                f"contender {name}",
                f"execute {key} (policy {policy}; provider: {_label(fault)}; verifier read: "
                f"{_label(read)}) -> {describe_outcome(outcome)}",
                key,
                heard,
            )
            if isinstance(outcome, BaseException) and not isinstance(outcome, DataoadError):
                raise outcome

    @rule(key=st.sampled_from(KEYS), read=st.data())
    def operator_reconciles(self, key: str, read: st.DataObject) -> None:
        """An operator reconciles the key's UNKNOWN (or stranded) receipt, read-only."""
        receipt = self.loop.run(self.ledger.find(self.adapter.action_name, key))
        if receipt is None or (
            not receipt.is_pending
            and receipt.final_status is not None
            and receipt.final_status is not ActionStatus.UNKNOWN
        ):
            return
        how = read.draw(st.sampled_from(self._read_names()), label="verifier read")
        runner = ActionRunner(self.ledger, verifier_timeout=None)
        heard: list[str] = []

        async def reconcile() -> Any:
            try:
                return await runner.recover_pending(receipt.action_id, self._verifier(how, heard))
            except DataoadError as exc:
                return exc

        outcome = self.loop.run(reconcile())
        self._step(
            "operator",
            f"reconciles {key} read-only (verifier read: {_label(how)}) -> {describe_outcome(outcome)}",
            key,
            heard,
        )

    @rule(key=st.sampled_from(KEYS))
    def in_flight_request_lands(self, key: str) -> None:
        """The provider finally processes requests still in flight (unless fenced)."""
        if SandboxFault.IN_FLIGHT.name not in self.sandbox_faults:
            return
        if not self.adapter.in_flight(self._reference(key)):
            return
        self.adapter.land_in_flight()
        self._step("provider", "in-flight requests land", key)

    # -- invariants --------------------------------------------------------------------------

    def _fail(self, name: str, detail: str) -> None:
        type(self).found = True
        self._step("checker", f"invariant {name} broken: {detail}", None)
        raise AdapterViolation(name, detail, list(self.steps))

    @invariant()
    def every_call_kept_the_contract(self) -> None:
        """Each perform and verify call, judged against the oracle when it returned."""
        if self.problems:
            name, detail = self.problems[0]
            self._fail(name, detail)

    @invariant()
    def receipts_agree_with_the_provider(self) -> None:
        """CONFIRMED and FAILED receipts match the oracle; no claim has two effects."""
        for key in KEYS:
            ref = self._reference(key)
            effects = self.adapter.effects(ref)
            if effects > 1:
                self._fail(
                    "at-most-one-effect-per-claim",
                    f"the provider holds {effects} effects for {ref}, which has one claim",
                )
            receipt = self.loop.run(self.ledger.find(self.adapter.action_name, key))
            if receipt is None:
                continue
            if receipt.final_status is ActionStatus.CONFIRMED and effects == 0:
                self._fail(
                    "confirmed-only-with-the-effect",
                    f"the receipt for {key} says CONFIRMED, but the provider holds no effect",
                )
            if receipt.final_status is ActionStatus.FAILED and (
                effects or self.adapter.in_flight(ref)
            ):
                self._fail(
                    "failed-only-when-nothing-can-appear",
                    f"the receipt for {key} says FAILED, but the provider holds {effects} "
                    f"effect(s){' and a request in flight' if self.adapter.in_flight(ref) else ''}",
                )


def _machine_for(adapter: ProviderAdapter) -> type[AdapterMachine]:
    sandbox, reads, skipped = _supported(adapter)
    machine = type(
        f"AdapterMachine_{type(adapter).__name__}",
        (AdapterMachine,),
        {"adapter": adapter, "sandbox_faults": sandbox, "read_faults": reads, "examples": 0},
    )
    machine.skipped = skipped  # type: ignore[attr-defined]
    return machine


def check_adapter(
    adapter: ProviderAdapter,
    *,
    profile: str = "ci",
    max_examples: int | None = None,
    seed_value: int | None = None,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
    call_timeout: float = 10.0,
    watch: CallWatch | None = None,
) -> AdapterCheckReport:
    """Run the adapter-contract machine over ``adapter`` within a budget; never raises for a violation.

    ``progress``, if given, is called with a one-line status as each example starts.
    A ``perform`` or ``verify`` call taking over ``call_timeout`` seconds is a
    violation. If a sandbox hook (``reset``, ``effects``, ``in_flight``,
    staging a fault) raises, the report says so in ``error``. ``watch``
    (the command line's) is told of each call, to end one no timer can.
    """
    if not isinstance(adapter, ProviderAdapter):
        raise TypeError(f"expected a ProviderAdapter, not {type(adapter).__qualname__}")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, not {profile!r}")
    if not 0.001 <= call_timeout <= 3600:  # NaN fails too
        raise ValueError(f"call_timeout must be in [0.001, 3600] seconds, not {call_timeout!r}")
    started = time.monotonic()
    violation: AdapterViolation | None = None
    error: str | None = None
    examples = 0
    skipped: list[str] = []
    try:
        machine = _machine_for(adapter)
        skipped = list(machine.skipped)  # type: ignore[attr-defined]
        machine.progress = progress
        machine.call_timeout = call_timeout
        machine.watch = watch
        if seed_value is not None:
            machine = seed(seed_value)(machine)
        try:
            # Cast: whether Hypothesis types this function differs between its releases.
            cast(Any, run_state_machine_as_test)(
                machine, settings=search_settings(profile, max_examples, False)
            )
        finally:
            examples = machine.examples
    except AdapterViolation as exc:
        violation = exc
    except KeyboardInterrupt:
        raise  # a person's Ctrl-C
    except BaseException as exc:
        # Not a contract the adapter broke but a sandbox it could not run (or
        # an exit it called): said in one line, with the report files, never
        # a traceback nor the adapter's own exit status.
        error = f"the adapter raised {type(exc).__name__}: {shown(exc, 200)}"
    return AdapterCheckReport(
        adapter=name or type(adapter).__qualname__,
        examples=examples,
        seconds=time.monotonic() - started,
        violation=violation,
        skipped_faults=skipped,
        error=error,
    )


def adapter_test_case(
    adapter_factory: Callable[[], ProviderAdapter],
    *,
    profile: str = "ci",
    max_examples: int | None = None,
) -> type[unittest.TestCase]:
    """A TestCase class that runs the checker; assign it to a ``Test...`` name in your tests."""

    class AdapterContract(unittest.TestCase):
        def test_adapter_keeps_the_contract(self) -> None:
            report = check_adapter(adapter_factory(), profile=profile, max_examples=max_examples)
            if report.violation is not None:
                self.fail(report.render())

    AdapterContract.__qualname__ = AdapterContract.__name__ = "AdapterContract"
    return AdapterContract
