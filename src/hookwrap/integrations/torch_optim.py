"""Every ``torch.optim`` optimizer's ``step`` as a join point, in one call.

``weave_optimizers()`` weaves ``step`` of ``torch.optim.Optimizer`` and of every
subclass that defines its own: those that exist now (SGD, Adam, ... and any a
library or the script defined already), and those defined later (a custom
optimizer in the script, ``ZeroRedundancyOptimizer`` once imported), woven as
their class is created (``Optimizer.__init_subclass__``). So a plain training
script gets a ``step`` event per ``optimizer.step()``, whether the optimizer was
created before or after the weave:

```python
handle = weave_optimizers()
hw.register_global_callback(StepTimer())        # every optimizer, every step
hw.before(torch.optim.Optimizer, "step", fn)    # class tier: all optimizers
handle.remove()                                 # everything as it was
```

Callbacks fire once per ``opt.step()``: torch re-wraps ``cls.step`` for its
profiler when a class's first instance is made, an LR scheduler wraps
``opt.step`` on the instance, and an override calling ``super().step()`` reaches
its base's join point; each of those reaches the outermost join point once. An LR
scheduler made before the weave wrapped the optimizer's plain ``step`` on the
instance, where the weave of the class never reaches: those optimizers (found
among the live objects when weaving) get the wrapper again, around the join point.

After ``remove()``, an optimizer that an LR scheduler wrapped while woven keeps
the wrapper it made, which calls the join point it captured: class-tier
callbacks are gone with the weave, but global callbacks still registered still
fire for that optimizer's steps (remove them too; new optimizers are plain).
"""

from __future__ import annotations

import threading
from typing import Any

from ..extend import Removable, is_join_point, weave_only
from ..errors import HookError, SettingError, safe_repr
from .. import WeaveHandle
from . import needs_framework

__all__ = ["OptimizerWeave", "weave_optimizers"]

_active: list[OptimizerWeave] = []  # at most one: a second weave would find step woven
_lock = threading.RLock()


class OptimizerWeave(Removable):
    """What ``weave_optimizers()`` returns: ``remove()`` restores ``step`` of every
    class it wove (those created since included) and ``Optimizer.__init_subclass__``."""

    def __init__(self, event: str) -> None:
        self.event = event
        self.handles: dict[type, WeaveHandle] = {}  # class -> its weave, in weaving order
        self._had_hook = False
        self._old_hook: Any = None
        self._removed = False
        # Optimizers whose LR scheduler's wrapper, made before the weave, was made again
        # around the join point: (the optimizer, weakly; the scheduler's wrapper; ours).
        self._rewrapped: list[tuple[Any, Any, Any]] = []

    @property
    def classes(self) -> list[type]:
        """The classes whose ``step`` is woven, in the order they were woven."""
        return list(self.handles)

    def _weave_class(self, cls: type) -> None:
        if self._removed or cls in self.handles or "step" not in vars(cls):
            return
        if is_join_point(vars(cls)["step"]):
            return  # already hookable (@hw.hookable, or a weave of its own): left alone
        # Each class woven apart (its overrides too, as they come): `classes` lists them.
        self.handles[cls] = weave_only(cls, "step") if self.event == "step" else weave_only(cls, **{self.event: "step"})

    def rewrap_scheduled(self, base: type) -> None:
        """The optimizers alive now whose ``step`` an LR scheduler wrapped on the
        instance before the weave: the wrapper calls the plain function it captured,
        so the join point of the class would never fire for them. Each gets a wrapper
        that marks the step taken for its scheduler, as torch's does, and calls the
        class's ``step`` as it is now (the join point)."""
        import functools
        import gc
        import weakref

        # type(o), not isinstance: a proxy's __class__ may warn (torch.distributed.reduce_op)
        for opt in [o for o in gc.get_objects() if issubclass(type(o), base)]:
            captured = vars(opt).get("step")
            inner: Any = getattr(captured, "__wrapped__", captured)  # the step it captured
            if not getattr(captured, "_wrapped_by_lr_sched", False) or is_join_point(inner) \
                    or not any(cls in self.handles for cls in type(opt).__mro__):
                continue
            reference = weakref.ref(opt)

            @functools.wraps(inner)
            def step(*args: Any, _reference: Any = reference, **kwargs: Any) -> Any:
                optimizer = _reference()
                optimizer._opt_called = True  # what the scheduler checks before its own step
                return type(optimizer).step(optimizer, *args, **kwargs)

            step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
            opt.step = step
            self._rewrapped.append((reference, captured, step))

    def remove(self) -> None:
        with _lock:
            if self._removed:
                return
            self._removed = True
            for reference, captured, ours in self._rewrapped:
                opt = reference()
                if opt is not None and vars(opt).get("step") is ours:
                    opt.step = captured  # the scheduler's own wrapper, as it was
            self._rewrapped.clear()
            import torch.optim

            base: Any = torch.optim.Optimizer  # Any: torch may be absent to mypy
            if self._had_hook:
                base.__init_subclass__ = self._old_hook
            else:
                try:
                    del base.__init_subclass__
                except AttributeError:
                    pass
            for handle in reversed(list(self.handles.values())):
                handle.remove()
            self.handles.clear()
            if self in _active:
                _active.remove(self)

    def __repr__(self) -> str:
        state = "removed" if self._removed else f"{len(self.handles)} classes"
        return f"<hookwrap.integrations.torch_optim.OptimizerWeave {self.event!r} {state}>"


def _subclasses(cls: type) -> list[type]:
    """``cls`` and its subclasses, each once, bases before subclasses."""
    seen: dict[type, None] = {}
    todo = [cls]
    while todo:
        klass = todo.pop(0)
        if klass not in seen:
            seen[klass] = None
            todo.extend(type.__subclasses__(klass))
    return list(seen)


@needs_framework("torch_optim")
def weave_optimizers(event: str = "step") -> OptimizerWeave:
    """Weave ``step`` of ``torch.optim.Optimizer`` and every subclass defining it, now
    and as new subclasses are defined, as join point ``event`` (default ``"step"``,
    the event ``StepTimer``, ``NanGuard``'s step count and ``ProgressBar`` use).
    Imports torch.optim. Returns a handle; ``remove()`` undoes all of it."""
    if not isinstance(event, str) or not event.isidentifier():
        raise SettingError(
            f"weave_optimizers(event={safe_repr(event)}): event is the name every optimizer's step takes as a "
            f"join point ('step'). It weaves every torch.optim optimizer at once, none in particular: call "
            f"weave_optimizers(), then attach a callback to the optimizer you want (hw.add_callback(optimizer, "
            f"cb)) or to all (hw.register_global_callback(cb)).")
    import torch.optim

    with _lock:
        if _active:
            raise HookError(
                f"weave_optimizers(): torch.optim is already woven ({_active[0]!r}); "
                f"remove() that handle first, or register on the join points it made."
            )
        base: Any = torch.optim.Optimizer  # Any: torch may be absent to mypy
        woven = OptimizerWeave(event)
        try:
            for cls in _subclasses(base):
                woven._weave_class(cls)
        except BaseException:
            woven._removed = False
            woven.remove()
            raise
        woven._had_hook = "__init_subclass__" in vars(base)
        woven._old_hook = vars(base).get("__init_subclass__")
        old = woven._old_hook

        def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
            if old is not None:
                old.__get__(None, cls)(**kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            woven._weave_class(cls)

        base.__init_subclass__ = classmethod(__init_subclass__)
        woven.rewrap_scheduled(base)
        _active.append(woven)
        return woven
