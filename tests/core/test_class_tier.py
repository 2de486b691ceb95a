"""docs/design/contract.md §3, class tier: the ArcticTraining callback docs, example by example."""

from __future__ import annotations

import pytest


def base_trainer(hw, log):
    class Trainer(hw.Hookable):
        def __init__(self):
            log.append("init")

        @hw.hookable
        def step(self, batch):
            log.append(("step", batch))
            return batch

        @hw.hookable
        def epoch(self):
            log.append("epoch")

        @hw.hookable("loss")
        def compute_loss(self, batch):
            return sum(batch)

    return Trainer


def test_docs_pre_init_callback_appended_to_callbacks(hw):
    log = []
    Trainer = base_trainer(hw, log)

    def pre_init_callback(self):
        log.append(f"{self.__class__.__name__} initializing")

    trainer = Trainer()
    trainer.callbacks.append(("pre-init", pre_init_callback))
    trainer.__init__()  # re-running init fires the newly added callback
    assert log == ["init", "Trainer initializing", "init"]


def test_docs_pre_loss_callbacks_take_nothing_or_the_batch(hw):
    log = []
    Trainer = base_trainer(hw, log)

    def pre_loss_callback_1(self):
        log.append("Loss callback triggered")

    def pre_loss_callback_2(self, batch):
        log.append(f"Loss callback triggered with batch {batch}")
        return batch

    def post_loss_callback(self, return_value):
        log.append(f"Loss callback triggered with return value {return_value}")
        return return_value

    class MyTrainer(Trainer):
        callbacks = [
            ("pre-loss", pre_loss_callback_1),
            ("pre-loss", pre_loss_callback_2),
            ("post-loss", post_loss_callback),
        ]

    log.clear()
    assert MyTrainer().compute_loss([1, 2]) == 3
    assert log == [
        "init",
        "Loss callback triggered",
        "Loss callback triggered with batch [1, 2]",
        "Loss callback triggered with return value 3",
    ]


def test_docs_class_list_and_method_forms_are_equivalent(hw):
    log = []
    Trainer = base_trainer(hw, log)

    def pre_step_callback(self, batch):
        log.append(f"Step callback triggered with batch {batch}")
        return batch

    class ListTrainer(Trainer):
        name = "my_trainer"
        callbacks = [("pre-step", pre_step_callback)]

    class MethodTrainer(Trainer):
        name = "my_trainer"

        def pre_step_callback(self, batch):
            log.append(f"Step callback triggered with batch {batch}")
            return batch

    ListTrainer().step(5)
    first = list(log)
    log.clear()
    MethodTrainer().step(5)
    assert log == first == ["init", "Step callback triggered with batch 5", ("step", 5)]


def test_docs_inheritance_chains_a_method_b_list_b_method(hw):
    log = []
    Trainer = base_trainer(hw, log)

    class TrainerA(Trainer):
        name = "trainer_a"

        def post_epoch_callback(self):
            log.append("Trainer A post epoch callback")

    class TrainerB(TrainerA):
        name = "trainer_b"

        callbacks = [("post-epoch", lambda self: log.append("Trainer B post epoch callback 1"))]

        def post_epoch_callback(self):
            log.append("Trainer B post epoch callback 2")

    t = TrainerB()
    log.clear()
    t.epoch()
    assert log == [
        "epoch",
        "Trainer A post epoch callback",
        "Trainer B post epoch callback 1",
        "Trainer B post epoch callback 2",
    ]
    log.clear()
    TrainerA().epoch()
    assert log == ["init", "epoch", "Trainer A post epoch callback"]


def test_setting_the_name_to_none_drops_the_inherited_callback(hw):
    log = []
    Trainer = base_trainer(hw, log)

    class A(Trainer):
        def post_epoch_callback(self):
            log.append("A")

    class B(A):
        post_epoch_callback = None

    class C(B):
        callbacks = [("post-epoch", lambda self: log.append("C list"))]

    C().epoch()
    assert log == ["init", "epoch", "C list"]


def test_callbacks_none_drops_the_inherited_lists(hw):
    log = []
    Trainer = base_trainer(hw, log)

    class A(Trainer):
        callbacks = [("post-epoch", lambda self: log.append("A list"))]

        def post_epoch_callback(self):
            log.append("A method")

    class B(A):
        callbacks = None

    B().epoch()
    assert log == ["init", "epoch", "A method"]


def test_event_part_of_method_name_matches_dash_or_underscore(hw):
    log = []

    class Trainer(hw.Hookable):
        @hw.hookable("train-batch")
        def train_batch(self):
            log.append("train")

        def pre_train_batch_callback(self):
            log.append("pre")

    Trainer().train_batch()
    assert log == ["pre", "train"]


def test_definition_order_within_a_class(hw):
    log = []
    Trainer = base_trainer(hw, log)

    class T(Trainer):
        callbacks = [("post-epoch", lambda self: log.append("list 1")), ("post-epoch", lambda self: log.append("list 2"))]

        def post_epoch_callback(self):
            log.append("method")

        def pre_epoch_callback(self):
            log.append("pre method")

    T().epoch()
    assert log == ["init", "pre method", "epoch", "list 1", "list 2", "method"]


def test_order_does_not_depend_on_which_classes_were_instantiated_first(hw):
    def build():
        log = []
        Trainer = base_trainer(hw, log)

        class A(Trainer):
            def post_epoch_callback(self):
                log.append("A")

        class B(A):
            def post_epoch_callback(self):
                log.append("B")

        return log, A, B

    log1, A1, B1 = build()
    A1().epoch()
    B1().epoch()
    log2, A2, B2 = build()
    B2().epoch()
    A2().epoch()
    assert [x for x in log1 if x != "init"] == ["epoch", "A", "epoch", "A", "B"]
    assert [x for x in log2 if x != "init"] == ["epoch", "A", "B", "epoch", "A"]


def test_class_list_is_shared_by_instances_and_never_mutated(hw):
    log = []
    Trainer = base_trainer(hw, log)
    declared = [("post-epoch", lambda self: log.append("class"))]

    class T(Trainer):
        callbacks = declared

    a, b = T(), T()
    a.callbacks.append(("post-epoch", lambda self: log.append("a only")))
    log.clear()
    a.epoch()
    b.epoch()
    assert log == ["epoch", "class", "a only", "epoch", "class"]
    assert len(declared) == 1 and len(T.callbacks) == 1
    assert len(a.callbacks) == 1 and b.callbacks == []


def test_mixin_callbacks_for_events_defined_elsewhere(hw):
    log = []
    Trainer = base_trainer(hw, log)

    class LoggingMixin(hw.Hookable):
        callbacks = [("post-step", lambda self, batch: log.append(("logged", batch)))]

    class MyTrainer(LoggingMixin, Trainer):
        pass

    MyTrainer().step(3)
    assert log == ["init", ("step", 3), ("logged", 3)]


def test_a_base_whose_init_subclass_forgets_super_still_prepares_subclasses(hw):
    """Audit item 3: class callbacks of such subclasses never ran, typos went unnoticed."""
    seen = []

    class Base(hw.Hookable):
        def __init_subclass__(cls, **kwargs):  # no super().__init_subclass__()
            seen.append(cls.__name__)

        @hw.hookable
        def step(self, x):
            return x

    class Trainer(Base):
        def pre_step_callback(self, x):
            return x * 10

    assert seen == ["Trainer"]
    assert Trainer().step(1) == 10
    with pytest.raises(hw.UnknownEventError, match="stpe"):
        class Typo(Base):
            def pre_stpe_callback(self, x):
                return x


def test_class_body_declarations_assigned_later_are_refused_not_ignored(hw):
    # Read when the class is created (no metaclass sees a later assignment): one
    # assigned afterwards is refused where the class tier is read next.
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, x):
            return x

    class Other(hw.Hookable):
        @hw.hookable
        def step(self, x):
            return x

    trainer = Trainer()
    Trainer.callbacks = [("pre-step", lambda self, x: x + 1)]
    with pytest.raises(hw.HookError, match=r"Trainer\.callbacks was assigned after the class was created.*"
                                           r"hookwrap\.before\(.*Trainer, 'step', fn\)"):
        trainer.before("step", lambda self, x: x)
    with pytest.raises(hw.HookError, match=r"Trainer\.callbacks was assigned after"):
        hw.before(Trainer, "step", lambda self, x: x)
    with pytest.raises(hw.HookError, match=r"Trainer\.callbacks was assigned after"):
        hw.describe(Trainer)
    del Trainer.callbacks
    trainer.before("step", lambda self, x: x + 1)
    assert trainer.step(1) == 2 and trainer.callbacks and Trainer().callbacks == []

    Other.pre_step_callback = lambda self, x: x + 1
    with pytest.raises(hw.HookError, match=r"Other\.pre_step_callback was assigned or deleted after the class "
                                           r"was created.*Declare it in the class body"):
        Other().step(1)  # its chain is planned at the first call
    del Other.pre_step_callback
    assert Other().step(1) == 1
