"""What runs around a join point's callbacks, when they run (``hookwrap.extend.guard``).

The dispatch runs a chain only when callbacks are to run; with none it calls the
function itself, at the cost of the dispatch alone. A preset uses that: what it
adds around a framework's stage (catch ``StopTraining`` and stop the framework's
way, refuse a change the framework would never see) is only needed when a
callback runs, so it is the join point's ``guard``, which both twins read only
on that path (``_fast._run_guarded`` and its mirror ``_fast_py._run_guarded``):
the chain runs around a recorder of the function, in the twin's own runner, and
the guard's functions are called only when their case comes."""

from __future__ import annotations

from typing import Any, Callable

from ._policy import DONE, NOT_STARTED, STARTED

__all__ = ["DONE", "Guard", "NOT_STARTED", "STARTED"]


class Guard:
    """``stopped(obj, exc, ran, result, args, kwargs)``: a callback of the call raised
    StopTraining ``exc``; ``ran`` says how far the function got (NOT_STARTED,
    STARTED: interrupted midway, DONE: ``result`` is what it returned), ``args`` and
    ``kwargs`` are the call's own (``args[0]`` the object). It returns what the
    call returns, or raises. ``admit(obj)`` (optional): False runs the function
    alone, without callbacks. ``changed(obj, original, result)`` (optional): the
    callbacks returned another value than the function did."""

    __slots__ = ("admit", "changed", "stopped")

    def __init__(self, stopped: Callable[..., Any], admit: Callable[[Any], bool] | None = None,
                 changed: Callable[[Any, Any, Any], None] | None = None) -> None:
        self.stopped, self.admit, self.changed = stopped, admit, changed
