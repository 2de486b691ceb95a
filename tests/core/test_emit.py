"""docs/design/contract.md §4: custom events, Lightning Fabric `call` style."""

from __future__ import annotations

import pytest


def make(hw):
    class Trainer(hw.Hookable):
        emits = ("on_train_batch_end", "on_fit_end")
        callbacks = [("on_fit_end", lambda self: self.log.append("declared"))]

        def __init__(self):
            self.log = []

    return Trainer


def test_each_callback_gets_only_the_keywords_it_names(hw):
    t = make(hw)()
    t.on("on_train_batch_end", lambda self, loss: self.log.append(("loss", loss)))
    t.on("on_train_batch_end", lambda self, output, loss: self.log.append(("both", output, loss)))
    t.on("on_train_batch_end", lambda self: self.log.append("none"))
    t.emit("on_train_batch_end", loss=0.5, output="y")
    assert t.log == [("loss", 0.5), ("both", "y", 0.5), "none"]


def test_class_list_and_callback_objects_and_global(hw):
    Trainer = make(hw)
    t = Trainer()

    class Saver(hw.Callback):
        def on_fit_end(self, trainer):
            trainer.log.append("saver")

    class Other(hw.Callback):  # has no on_fit_end: skipped
        def on_train_batch_end(self, trainer, loss):
            trainer.log.append("other")

    t.add_callback(Saver())
    t.add_callback(Other())
    with hw.register_global_callback(("on_fit_end", lambda self: self.log.append("global"))):
        hw.emit(t, "on_fit_end")
    assert t.log == ["declared", "saver", "global"]


def test_missing_keyword_and_defaults(hw):
    t = make(hw)()
    t.on("on_train_batch_end", lambda self, loss, step=-1: self.log.append((loss, step)))
    t.emit("on_train_batch_end", loss=1)
    t.emit("on_train_batch_end", loss=2, step=5)
    assert t.log == [(1, -1), (2, 5)]
    t.on("on_train_batch_end", lambda self, grad_norm: None)
    with pytest.raises(hw.HookError, match=r"needs grad_norm, but the event was emitted with loss"):
        t.emit("on_train_batch_end", loss=3)


def test_undeclared_custom_event(hw):
    t = make(hw)()
    with pytest.raises(hw.UnknownEventError, match=r"declares no custom event 'on_fit_ends'.*Did you mean 'on_fit_end'.*emits = \('on_fit_ends',\)"):
        t.emit("on_fit_ends")
    with pytest.raises(hw.UnknownEventError, match=r"declares no custom event 'on_epoch_end'"):
        t.on("on_epoch_end", lambda self: None)


def test_custom_callbacks_return_none_and_errors_get_notes(hw):
    t = make(hw)()
    h = t.on("on_fit_end", lambda self: 1)
    with pytest.raises(hw.CallbackReturnError, match=r"custom event callbacks observe and return None"):
        t.emit("on_fit_end")
    h.remove()

    def boom(self):
        raise OSError("disk full")

    t.on("on_fit_end", boom)
    with pytest.raises(OSError) as info:
        t.emit("on_fit_end")
    assert "boom" in info.value.__notes__[0]


def test_on_is_checked_at_registration(hw):
    t = make(hw)()
    with pytest.raises(hw.HookError, match=r"takes \*\*kw; name the keywords"):
        t.on("on_fit_end", lambda self, **kw: None)
    with pytest.raises(hw.HookError, match=r"on\(\) takes a custom event name like 'on_fit_end'"):
        t.on("pre-step", lambda self: None)


def test_filters_on_custom_events(hw):
    t = make(hw)()
    t.on("on_train_batch_end", lambda self, loss: self.log.append(loss), every=2)
    for i in range(5):
        t.emit("on_train_batch_end", loss=i)
    assert t.log == [1, 3]


def test_planned_emit_follows_call_shapes_and_registrations(hw):
    """emit plans what each listener gets per call shape (the keyword names, in
    order) and keeps it until a registration of that event drops it."""
    t = make(hw)()
    t.on("on_train_batch_end", lambda self, loss: self.log.append(("loss", loss)))
    t.emit("on_train_batch_end", loss=1)  # every keyword: passed as given
    t.emit("on_train_batch_end", loss=2, output="y")  # a listener takes a subset
    t.emit("on_train_batch_end", output="z", loss=3)  # the same names, another order
    assert t.log == [("loss", 1), ("loss", 2), ("loss", 3)]
    handle = t.on("on_train_batch_end", lambda self, output: self.log.append(("output", output)))
    t.log.clear()
    t.emit("on_train_batch_end", loss=4, output="w")  # the new listener is planned in
    assert t.log == [("loss", 4), ("output", "w")]
    for _ in range(2):  # a missing keyword fails on every emit, not only the first
        with pytest.raises(hw.HookError, match=r"needs output, but the event was emitted with loss"):
            t.emit("on_train_batch_end", loss=5)
    handle.remove()
    t.log.clear()
    t.emit("on_train_batch_end", loss=6)  # and removing it un-plans it
    assert t.log == [("loss", 6)]
    other = make(hw)()  # another instance: only its class's listeners
    other.emit("on_train_batch_end", loss=7)
    assert other.log == []
    other.on("on_train_batch_end", lambda self, loss: self.log.append(("loss", loss)))
    other.emit("on_train_batch_end", loss=8)  # an event emitted to no one, then listened to
    assert other.log == [("loss", 8)]
    for _ in range(2):  # an unknown event fails every time too
        with pytest.raises(hw.UnknownEventError):
            t.emit("on_train_batch_ends", loss=1)


def test_every_spelling_of_an_emit_call(hw):
    """obj.emit, hw.emit(obj, ...), the bound method kept aside, the class's
    function called with the object, a class as target: one behaviour. Calls
    Python would refuse are refused the same way; more keywords than the
    compiled path's array still reach every listener."""
    import inspect

    Trainer = make(hw)
    t = Trainer()
    t.on("on_train_batch_end", lambda self, loss: self.log.append(loss))
    t.emit("on_train_batch_end", loss=1)
    hw.emit(t, "on_train_batch_end", loss=2)
    fire = t.emit
    fire("on_train_batch_end", loss=3)
    Trainer.emit(t, "on_train_batch_end", loss=4)
    fire("on_train_batch_end", **{"loss": 5})
    assert t.log == [1, 2, 3, 4, 5]
    Other = make(hw)
    calls = []
    hw.on(Other, "on_train_batch_end", lambda cls, loss: calls.append((cls, loss)))
    hw.emit(Other, "on_train_batch_end", loss=6)
    assert calls == [(Other, 6)]
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'name'"):
        t.emit()
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
        hw.emit(t, "on_fit_end", 1)
    with pytest.raises(hw.HookError, match=r"emit\(int, .on_fit_end.\): int declares no custom event"):
        hw.emit(3, "on_fit_end")
    many = {f"k{i}": i for i in range(40)}
    t.on("on_train_batch_end", lambda self, k39=None: self.log.append(k39))
    t.log.clear()
    t.emit("on_train_batch_end", loss=0, **many)
    t.emit("on_train_batch_end", **many, loss=0)
    assert t.log == [0, 39, 0, 39]
    assert list(inspect.signature(hw.emit).parameters) == ["target", "name", "kwargs"]


@pytest.mark.parametrize("emits, message", [
    ((42,), r"42 is not a custom event name"),
    ("on_x", r"must be a list of custom event names, like \('on_x',\), not a str"),
    (("pre-step",), r"'pre-step' is not a custom event name"),
    (7, r"not a int"),
])
def test_emits_is_checked_when_the_class_is_defined(hw, emits, message):
    """Audit item 18: these passed class definition and failed later, or never."""
    with pytest.raises(hw.HookError, match=message):
        type("Loop", (hw.Hookable,), {"emits": emits})


def test_emits_declared_in_the_body_is_checked(hw):
    with pytest.raises(hw.HookError, match=r"'pre-step' is not a custom event name"):
        class Loop(hw.Hookable):
            emits = ("on_ok", "pre-step")


def test_a_listener_without_self_is_refused_not_handed_the_object(hw):
    """Audit item 7: `lambda loss: ...` got the object as `loss`."""
    class Loop(hw.Hookable):
        emits = ("on_batch_end",)

    loop, seen = Loop(), []

    def record(loss):
        seen.append(loss)

    loop.on("on_batch_end", record)
    with pytest.raises(hw.HookError, match=r"first parameter 'loss' receives the object that emits the event"):
        loop.emit("on_batch_end", loss=0.5)
    assert seen == []
