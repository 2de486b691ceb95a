"""Snapshot semantics and thread safety; register/remove sequences against a model."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st


def make(hw):
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, log):
            return log

    return Trainer


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.booleans()),  # (add, prepend)
        st.tuples(st.just("remove"), st.integers(min_value=0, max_value=30)),
        st.tuples(st.just("add_class"), st.booleans()),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_register_remove_sequences_match_a_model(hw_module, ops):
    hw = hw_module
    Trainer = make(hw)
    t = Trainer()
    instance_model: list[int] = []  # callback ids, in run order
    class_model: list[int] = []
    handles: list[tuple[object, int, str]] = []
    for n, (op, arg) in enumerate(ops):
        if op == "add":
            h = t.before("step", lambda self, log, n=n: (log.append(n), log)[1], prepend=arg)
            if arg:
                instance_model.insert(0, n)
            else:
                instance_model.append(n)
            handles.append((h, n, "instance"))
        elif op == "add_class":
            h = hw.before(Trainer, "step", lambda self, log, n=n: (log.append(n), log)[1])
            class_model.append(n)
            handles.append((h, n, "class"))
        elif handles:
            h, ident, tier = handles.pop(arg % len(handles))
            h.remove()
            h.remove()
            (instance_model if tier == "instance" else class_model).remove(ident)
        assert t.step([]) == class_model + instance_model


def test_threads_registering_while_others_dispatch(hw):
    Trainer = make(hw)
    t = Trainer()
    errors: list[BaseException] = []
    stop = threading.Event()

    def dispatcher():
        try:
            while not stop.is_set():
                out = t.step([])
                assert len(out) == len(set(out))  # a snapshot never runs a callback twice
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def registrar(k):
        try:
            for i in range(100):
                h = t.before("step", lambda self, log, k=k, i=i: (log.append((k, i)), log)[1])
                if i % 2:
                    h.remove()
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    readers = [threading.Thread(target=dispatcher) for _ in range(2)]
    writers = [threading.Thread(target=registrar, args=(k,)) for k in range(4)]
    for th in readers + writers:
        th.start()
    for th in writers:
        th.join()
    stop.set()
    for th in readers:
        th.join()
    assert errors == []
    assert len(t.callbacks) == 200
    seen = t.step([])
    assert sorted(seen) == sorted((k, i) for k in range(4) for i in range(0, 100, 2))
    # Per thread, the order of registration is kept.
    for k in range(4):
        assert [i for kk, i in seen if kk == k] == list(range(0, 100, 2))


def test_a_callback_raising_mid_chain_leaves_everything_usable(hw):
    Trainer = make(hw)
    t = Trainer()

    def first(self, log):
        log.append("first")
        return log

    def broken(self, log):
        raise RuntimeError("callback failed")

    def last(self, log):
        log.append("last")
        return log

    t.before("step", first)
    bad = t.before("step", broken)
    t.before("step", last)
    hw.after(Trainer, "step", lambda self, return_value: return_value)
    for _ in range(3):  # the same failure each time: nothing half-applied stays behind
        log: list[str] = []
        try:
            t.step(log)
        except RuntimeError as exc:
            assert "callback failed" in str(exc)
        assert log == ["first"]
    bad.remove()
    assert t.step([]) == ["first", "last"]
    assert Trainer().step([]) == []  # other objects were never affected


def test_scoped_registrations_in_threads_run_exactly_once_each(hw):
    """Each thread registers on its own object inside a with-block and calls once,
    while another thread churns class-tier registrations (invalidating chains):
    every callback runs exactly once, on its own object, and all threads finish."""
    Trainer = make(hw)
    calls: dict[tuple[int, int], int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            t = Trainer()
            for i in range(200):
                def callback(self, log, key=(k, i)):
                    with lock:
                        calls[key] = calls.get(key, 0) + 1
                    log.append(key)
                    return log

                with t.before("step", callback):
                    seen = t.step([])
                assert seen == [(k, i)], seen  # its own callback alone, once
        except BaseException as exc:  # reported below
            errors.append(exc)

    def churn() -> None:
        try:
            while not stop.is_set():
                with hw.before(Trainer, "step", lambda self: None):
                    pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    churner = threading.Thread(target=churn)
    churner.start()
    for th in workers:
        th.start()
    for th in workers:
        th.join(timeout=60)
    stop.set()
    churner.join(timeout=60)
    assert not any(th.is_alive() for th in workers + [churner]), "a thread did not finish"
    assert errors == []
    assert calls == {(k, i): 1 for k in range(4) for i in range(200)}
