"""Thread hammer (issue 21, "Show"): registrations, removals, ``with cb:`` blocks,
``once``, ``every``, weave/remove, on the instance, class and global tiers, while
other threads dispatch. Counts are exact: what was registered for the whole window
fires exactly once per call, a ``once`` fires exactly once, ``every=N`` fires
floor(calls / N) times, what comes and goes fires at most once per call, and
after every removal a call fires nothing. No thread may raise.

Fixed iteration counts and a Barrier; no timing. Each callback appends its tag to
the call's own log (the join point's argument), so each call's chain is checked
on its own.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

DISPATCHERS = 2
CALLS = 1500  # per dispatcher
CHURN = 400  # register/remove rounds per churn thread


def _run_threads(targets: list[Callable[[], None]]) -> None:
    """Start every target behind one Barrier; join them; re-raise the first error."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                barrier.wait()
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported below, with its traceback
                errors.append(exc)
                barrier.abort()
        return body

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per run
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]


def _tagger(tag: str, post: bool = False) -> Callable[..., Any]:
    def cb(self: Any, log: list[str]) -> Any:
        log.append(tag)
        return None if post else log
    cb.__qualname__ = cb.__name__ = f"cb_{tag.replace('-', '_')}"
    return cb


def test_hammer_all_tiers_exact_counts(hw: Any) -> None:
    class HammerTrainer(hw.Hookable):
        @hw.hookable
        def hammer_step(self, log):
            log.append("body")
            return log

    class HammerCallback(hw.Callback):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def pre_hammer_step(self, trainer, log):
            log.append(self.tag)
            return log

    t = HammerTrainer()
    # Registered for the whole window, on every tier: each fires exactly once per call.
    whole = [
        t.before("hammer_step", _tagger("inst")),
        hw.before(HammerTrainer, "hammer_step", _tagger("cls")),
        hw.register_global_callback(("pre-hammer_step", _tagger("glob"))),
        t.after("hammer_step", _tagger("inst-post", post=True)),
        t.around("hammer_step", lambda self, proceed, log: proceed(log.append("around") or log)),
    ]
    # once=True on every tier (one with when=): each fires exactly once over all calls.
    once = [
        t.before("hammer_step", _tagger("once-inst"), once=True),
        hw.before(HammerTrainer, "hammer_step", _tagger("once-cls"), once=True),
        hw.register_global_callback(("pre-hammer_step", _tagger("once-glob")), once=True),
        t.before("hammer_step", _tagger("once-when"), once=True, when=lambda obj: True),
    ]
    # every=N: floor(total / N) fires, whichever thread makes the call.
    every = [
        t.before("hammer_step", _tagger("every3-inst"), every=3),
        hw.before(HammerTrainer, "hammer_step", _tagger("every7-cls"), every=7),
        t.before("hammer_step", _tagger("every5-when"), every=5, when=lambda obj: True),
    ]
    # One Callback object held open by an outer `with` for the window; other threads
    # nest blocks of the same object: it stays registered once, fires once per call.
    held = HammerCallback("held")
    held.__enter__()
    # Another Callback object only ever used in the churning threads' blocks.
    churned_cb = HammerCallback("with-churn")

    logs: list[list[list[str]]] = [[] for _ in range(DISPATCHERS)]

    def dispatcher(k: int) -> Callable[[], None]:
        def run() -> None:
            mine = logs[k]
            for _ in range(CALLS):
                mine.append(t.hammer_step([]))
        return run

    def churn_instance() -> None:
        for i in range(CHURN):
            h = t.before("hammer_step", _tagger("churn-inst"), prepend=bool(i % 2))
            h2 = t.after("hammer_step", _tagger("churn-inst-post", post=True), once=bool(i % 3 == 0))
            h.remove()
            h2.remove()
            h.remove()  # idempotent

    def churn_class() -> None:
        for i in range(CHURN):
            with hw.before(HammerTrainer, "hammer_step", _tagger("churn-cls"), every=1 + i % 3):
                pass
            h = hw.add_callback(HammerTrainer, HammerCallback("churn-cls-obj"))
            h.remove()

    def churn_global() -> None:
        for i in range(CHURN):
            h = hw.register_global_callback(("pre-hammer_step", _tagger("churn-glob")), once=bool(i % 2))
            h.remove()
            with held, churned_cb:  # held: nested in the outer block, never removes it
                pass

    def churn_with() -> None:
        for _ in range(CHURN):
            with churned_cb, churned_cb:  # nested blocks of one object
                pass
            with held:
                pass

    _run_threads([dispatcher(k) for k in range(DISPATCHERS)]
                 + [churn_instance, churn_class, churn_global, churn_with])

    calls = [log for mine in logs for log in mine]
    assert len(calls) == DISPATCHERS * CALLS
    totals: Counter[str] = Counter()
    for log in calls:
        per_call = Counter(log)
        for tag in ("body", "around", "inst", "cls", "glob", "inst-post", "held"):
            assert per_call[tag] == 1, (tag, log)
        for tag, n in per_call.items():
            assert n == 1, (tag, log)  # a snapshot never runs a callback twice
        totals.update(per_call)
    for tag in ("once-inst", "once-cls", "once-glob", "once-when"):
        assert totals[tag] == 1, (tag, totals[tag])
    total = DISPATCHERS * CALLS
    assert totals["every3-inst"] == total // 3
    assert totals["every7-cls"] == total // 7
    assert totals["every5-when"] == total // 5
    # Order within a call is the tiers' order: class, instance, global.
    for log in calls:
        core = [tag for tag in log if tag in ("cls", "inst", "glob", "around", "body", "inst-post")]
        assert core == ["cls", "inst", "glob", "around", "body", "inst-post"], log

    # Every removal: nothing but the body runs.
    held.__exit__(None, None, None)
    for h in whole + once + every:
        h.remove()
    assert t.hammer_step([]) == ["body"]
    assert HammerTrainer().hammer_step([]) == ["body"]
    assert churned_cb._hookwrap_blocks == 0 and held._hookwrap_blocks == 0


def test_hammer_many_instances_and_weave(hw: Any) -> None:
    """Objects created and hooked per thread, a class weaved and unweaved, while
    other threads call: each object's own callbacks stay its own."""

    class HammerPlain:
        def hammer_m(self, log):
            log.append("body")
            return log

    class HammerOwn(hw.Hookable):
        @hw.hookable
        def hammer_own(self, log):
            return log

    shared = HammerOwn()
    shared.before("hammer_own", _tagger("shared"))
    seen_woven: list[int] = [0]
    results: list[list[str]] = []

    def weaver() -> None:
        for _ in range(60):
            with hw.weave(HammerPlain, "hammer_m"):
                h = hw.before(HammerPlain, "hammer_m", _tagger("woven"))
                h.remove()

    def plain_caller() -> None:
        for _ in range(CALLS):
            log = HammerPlain().hammer_m([])
            assert log.count("body") == 1 and log.count("woven") <= 1, log
            seen_woven[0] += "woven" in log

    def own_objects(k: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(CALLS // 4):
                obj = HammerOwn()
                with obj.before("hammer_own", _tagger(f"own-{k}-{i}")):
                    assert obj.hammer_own([]) == [f"own-{k}-{i}"]
                assert obj.hammer_own([]) == []
                results.append(shared.hammer_own([]))
        return run

    _run_threads([weaver, plain_caller, own_objects(0), own_objects(1)])
    assert all(log == ["shared"] for log in results)
    assert len(results) == 2 * (CALLS // 4)
    assert HammerPlain().hammer_m([]) == ["body"]  # unwoven: the method itself
    assert hw.describe(HammerPlain()).chains == {} or not any(hw.describe(HammerPlain()).chains.values())
