"""What a step is: the one place that says which event counts one update.

On a loop of your own, a step is a call of the join point ``step`` (or of the
callbacks' ``step_event``). On a framework, a step is what the framework counts:
one optimizer update, however many batches it accumulates (HF's
``state.global_step``, Lightning's ``global_step``, one ``optimizer.step()`` that
Fabric or accelerate really runs). A preset declares that axis on the class it
weaves (``hookwrap.integrations._weaving.counts_updates`` writes the same mark);
a loop of your own declares it with ``counts_updates(MyLoop)``. Every shipped
callback that counts steps (``CountingCallback``) then numbers its file names,
messages, saved state and rows in updates, and its per-step work
(``every_n_steps``, GradNorm, LRMonitor) runs once per update.

How an update is counted: it opens at the first call of one of its ``opens``
events (the join points that begin a batch: ``step`` on HF and Lightning, whose
step wraps a batch; ``backward`` on Fabric and accelerate, where ``step`` is
said at the batch's end) or of the update event itself, and closes after the
update event. The step of anything said in between (a loss, a NaN, an
evaluation after the update) is that update's number: the framework's counter
plus one while the update is in progress, the framework's counter once done.
Where the framework keeps a counter (``counter``), an update that opens reads it,
so a run resumed by the framework numbers on from where the framework is.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ..errors import HookError, SettingError
from ..extend import has_join_point, join_points

__all__ = ["STEP_AXIS", "UpdateAxis", "axis_of", "counts_updates", "update_axes", "update_axis"]

# The mark a preset sets on the framework's class it weaves, and on the function of
# its update join point for the global tier (``hookwrap run``):
# hookwrap.integrations._weaving writes the same name, with the tuple UpdateAxis is.
STEP_AXIS = "__hookwrap_step_axis__"


class UpdateAxis(NamedTuple):
    """The step axis of a loop that counts optimizer updates."""

    update: str  # the join point of one update ("optimizer_step")
    opens: tuple[str, ...]  # the join points that begin a batch of an update ("step", "backward")
    counter: Callable[[Any], Any] | None  # the framework's count of updates done, read from the hooked object
    said: str  # what the framework calls a step, for messages ("state.global_step")

    def __reduce__(self) -> Any:  # a callback holding it pickles; the counter is found again when attached
        return (UpdateAxis, (self.update, self.opens, None, self.said))


def update_axes(target: Any) -> list[UpdateAxis]:
    """The update axes declared on ``target``: a class or one of its objects (one at
    most), or ``None``, the global tier, which reaches the loops of every preset woven
    (their ``optimizer_step`` join points' functions carry it). Empty: a step is a
    call of the step event."""
    if target is not None:
        found = axis_of(target)
        return [] if found is None else [found]
    axes: list[UpdateAxis] = []
    if has_join_point(None, "optimizer_step"):
        for jp in join_points(None, "optimizer_step", where="hookwrap.torch.steps"):
            mark = getattr(jp.function, STEP_AXIS, None)
            if isinstance(mark, tuple) and UpdateAxis(*mark) not in axes:
                axes.append(UpdateAxis(*mark))
    return axes


def update_axis(target: Any) -> UpdateAxis | None:
    """The first of ``update_axes(target)``, or ``None``."""
    axes = update_axes(target)
    return axes[0] if axes else None


def axis_of(target: Any) -> UpdateAxis | None:
    """The update axis a class declares (``target``, or the class of ``target``, a
    hooked object; ``None``, a function's join point: none), or ``None``."""
    if target is None:
        return None
    found = getattr(target if isinstance(target, type) else type(target), STEP_AXIS, None)
    return UpdateAxis(*found) if isinstance(found, tuple) else None


def counts_updates(cls: type, update: str = "optimizer_step", opens: tuple[str, ...] | str = ("step",),
                   counter: Callable[[Any], Any] | None = None) -> None:
    """Declare that a step of ``cls`` (a loop of your own) is one call of ``update``:
    the shipped callbacks attached to it afterwards count updates, not calls of
    ``step``, under gradient accumulation. ``opens``: the join points that begin a
    batch (an update opens at the first of them after the last update); ``counter``:
    a function of the loop object giving the updates done so far, when the loop keeps
    that count itself (read when an update opens, so a resumed loop numbers on)."""
    opens = (opens,) if isinstance(opens, str) else tuple(opens)
    where = f"hookwrap.torch.counts_updates({getattr(cls, '__qualname__', cls)!r})"
    if not isinstance(cls, type):
        raise HookError(f"{where}: pass the class of the loop, not {type(cls).__name__} {cls!r}.")
    for event in opens:
        join_points(cls, event, where=where)  # a misspelled event fails here, with the closest names
    updates = join_points(cls, update, where=where)
    if counter is not None and not callable(counter):
        raise SettingError(f"{where}: counter must be a function of the loop object returning its update "
                           f"count, got {counter!r}.")
    axis = (update, opens, counter, f"calls of {update!r}")
    setattr(cls, STEP_AXIS, axis)
    for jp in updates:  # the global tier finds it there
        setattr(jp.function, STEP_AXIS, axis)
