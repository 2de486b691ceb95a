"""Join points pickle by reference; hookable objects pickle and copy with their callbacks."""

from __future__ import annotations

import copy
import pickle

import pytest

from tests.core import _pickle_targets as targets


@pytest.fixture
def built(hw):
    targets.build(hw)
    return targets


def test_module_level_join_point_pickles_by_reference(built):
    assert pickle.loads(pickle.dumps(built.train_step)) is built.train_step
    assert copy.deepcopy(built.train_step) is built.train_step


def test_bound_join_point_pickles(built):
    t = built.Trainer(lr=1)
    step = pickle.loads(pickle.dumps(t.compute_loss))
    assert step(1) == 2


def test_hookable_object_pickles_with_its_instance_callbacks(built):
    t = built.Trainer(lr=0.5)
    t.before("loss", built.double_batch)
    clone = pickle.loads(pickle.dumps(t))
    assert clone.compute_loss(2) == 4.5
    assert clone.callbacks == [("pre-loss", built.double_batch)]
    clone.callbacks.clear()  # the clone's list is its own
    assert clone.compute_loss(2) == 2.5
    assert t.compute_loss(2) == 4.5


def test_deepcopy_copies_the_callbacks(built):
    t = built.Trainer()
    t.before("loss", lambda self, batch: batch * 10)
    clone = copy.deepcopy(t)
    assert clone.compute_loss(1) == pytest.approx(10.1)
    clone.callbacks.clear()
    assert clone.compute_loss(1) == pytest.approx(1.1)
    assert t.compute_loss(1) == pytest.approx(10.1)


def test_shallow_copy_gets_its_own_callback_list(built):
    t = built.Trainer()
    t.before("loss", lambda self, batch: batch * 10)
    clone = copy.copy(t)
    assert clone.compute_loss(1) == pytest.approx(10.1)
    clone.before("loss", lambda self, batch: batch + 1000)
    assert t.compute_loss(1) == pytest.approx(10.1)
    assert clone.compute_loss(1) == pytest.approx(1010.1)


def test_object_without_instance_callbacks_pickles_plainly(built):
    t = built.Trainer(lr=3)
    clone = pickle.loads(pickle.dumps(t))
    assert clone.compute_loss(1) == 4


def test_pickling_a_lambda_callback_names_it_and_says_how_to_save(hw, built):
    t = built.Trainer()
    t.before("loss", lambda self, batch: batch * 10)
    with pytest.raises(pickle.PicklingError) as raised:
        pickle.dumps(t)
    message = str(raised.value)
    assert isinstance(raised.value, hw.CallbackPicklingError)
    assert "<locals>.<lambda> (test_persistence.py:" in message
    assert "for event 'pre-loss' is a lambda" in message
    assert "torch.save(obj.state_dict(), path)" in message
    t.callbacks.clear()  # as the message says: without the callback it saves
    assert pickle.loads(pickle.dumps(t)).compute_loss(1) == pytest.approx(1.1)


def test_pickling_a_local_function_callback_is_refused_too(hw, built):
    def local(self, batch):
        return batch

    t = built.Trainer()
    t.before("loss", local)
    with pytest.raises(hw.CallbackPicklingError, match=r"is a function defined inside another function"):
        pickle.dumps(t)


def test_the_hookwrap_names_a_pickle_holds_are_pinned(built):
    """A hookable object's pickle (``torch.save(model)``) names these hookwrap
    classes by module path: moving or renaming one breaks loading saved objects,
    so it needs an alias left behind (or a deliberate, noted break)."""
    import io

    t = built.Trainer()
    t.before("loss", built.double_batch, every=2)
    seen: set[str] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add(f"{module}.{name}")
            return super().find_class(module, name)

    clone = Recording(io.BytesIO(pickle.dumps(t))).load()
    assert [clone.compute_loss(2), clone.compute_loss(2)] == [2.1, 4.1]  # every=2, loaded with it
    assert {name for name in seen if name.startswith("hookwrap")} == {
        "hookwrap._entries.Gate", "hookwrap._entries.Options", "hookwrap._entries.Registration",
        "hookwrap._registry.InstanceRecord",
    }


@pytest.mark.parametrize("saved_in", ["hookwrap._reader", "hookwrap._signature"])
def test_an_object_pickled_when_readers_lived_elsewhere_still_loads(hw, built, saved_in):
    """A callback object's reader pickles by the module path of its functions, which
    lived in hookwrap._reader, then hookwrap._signature, before both were merged
    into _joinpoints: a pickle naming them there still loads, and still reads."""
    t = built.Trainer()
    t.add_callback(built.Seen())
    t.compute_loss(1)
    new = pickle.dumps(t, protocol=0)
    assert b"hookwrap._joinpoints\n" in new
    clone = pickle.loads(new.replace(b"hookwrap._joinpoints\n", saved_in.encode() + b"\n"))
    clone.compute_loss(2)
    assert hw.callback_state(clone) == {"Seen": {"values": [1.1, 2.1]}}


@pytest.mark.parametrize("saved_in", ["hookwrap._instances", "hookwrap._tiers"])
def test_a_callbacks_list_pickled_where_it_was_defined_before_still_loads(built, saved_in):
    """InstanceCallbackList lived in hookwrap._instances, then in _tiers, before
    both were merged into _registry: a pickle naming either still loads."""
    t = built.Trainer()
    t.before("loss", built.double_batch)
    new = pickle.dumps(t.callbacks, protocol=0)
    assert b"hookwrap._registry\nInstanceCallbackList\n" in new
    old = new.replace(b"hookwrap._registry\nInstanceCallbackList\n", saved_in.encode() + b"\nInstanceCallbackList\n")
    assert pickle.loads(old) == [("pre-loss", built.double_batch)]


def test_an_object_pickled_when_its_registrations_lived_in_options_still_loads(built):
    """Registration, Options and Gate lived in hookwrap._options before it was merged
    into _entries: a pickle naming them there still loads."""
    t = built.Trainer()
    t.before("loss", built.double_batch, every=2)
    new = pickle.dumps(t, protocol=0)
    assert b"hookwrap._entries\nRegistration\n" in new
    clone = pickle.loads(new.replace(b"hookwrap._entries\n", b"hookwrap._options\n"))
    assert [clone.compute_loss(2), clone.compute_loss(2)] == [2.1, 4.1]  # every=2, loaded with it


def test_a_callback_state_pickled_when_it_lived_in_lifecycle_still_loads(hw, built):
    """CallbackState, which checkpoint systems save beside a model, lived in
    hookwrap._lifecycle before it was merged into _callback."""
    t = built.Trainer()
    t.before("loss", built.double_batch)
    new = pickle.dumps(hw.CallbackState(t), protocol=0)
    assert b"hookwrap._callback\nCallbackState\n" in new
    clone = pickle.loads(new.replace(b"hookwrap._callback\nCallbackState\n", b"hookwrap._lifecycle\nCallbackState\n"))
    assert type(clone) is hw.CallbackState and clone.obj.compute_loss(2) == 4.1


@pytest.mark.parametrize("saved_as", ["hookwrap._tiers\nInstanceHooks", "hookwrap._instances\nInstanceRecord",
                                      "hookwrap._instances\nInstanceHooks", "hookwrap._tiers\nInstanceRecord"])
def test_an_object_pickled_under_an_earlier_name_of_the_instance_record_still_loads(built, saved_as):
    """hookwrap 0.1.0 pickled an instance's record as hookwrap._tiers.InstanceHooks,
    later versions as hookwrap._tiers.InstanceRecord, then, while it lived in
    hookwrap._instances, as hookwrap._instances.InstanceRecord; it is now in _registry."""
    t = built.Trainer()
    t.before("loss", built.double_batch)
    new = pickle.dumps(t, protocol=0)  # names classes as text lines: renamable in place
    assert b"hookwrap._registry\nInstanceRecord\n" in new
    clone = pickle.loads(new.replace(b"hookwrap._registry\nInstanceRecord\n", saved_as.encode() + b"\n"))
    assert clone.compute_loss(2) == t.compute_loss(2) == 4.1  # its callback came back with it
    assert clone.callbacks == [("pre-loss", built.double_batch)]
