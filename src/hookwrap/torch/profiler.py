"""``Profiler``: named ranges around chosen join points, and ``torch.profiler`` over a
window of steps, written as a Chrome trace."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

from ..errors import SettingError
from ..extend import anchored, join_points, process_rank
from ._around import around_advice
from ._attach import DefaultEvent, On, ShippedCallback, event_names, whole_number

__all__ = ["Profiler"]

TRACE_FORMATS = ("chrome", "tensorboard")


# The profiler starts at a step's start; it steps (and writes its trace) at a step's
# end, and stops at the end of fit where there is one.
_STARTS = (On("pre", "step_event", "_start", always=True),)
_ENDS = (On("post", "step_event", "_step", always=True), On("post", "fit_event", "_end"))

class Profiler(ShippedCallback):
    """Puts a ``torch.profiler.record_function(f"hookwrap:{event}")`` range (and a
    ``torch.cuda.nvtx.range`` of the same name where CUDA is available) around each
    call of the join points ``events``, as around advice, and runs
    ``torch.profiler.profile`` over the calls of ``step_event``: started at the first
    step, ``prof.step()`` after each, with ``torch.profiler.schedule(wait=wait,
    warmup=warmup, active=active, repeat=1)``. When that window is done (or when
    ``fit_event`` ends first, with what was recorded) the trace is written with
    ``export_chrome_trace`` to ``dir/trace_rank{rank}.json`` (open it in Perfetto or
    ``chrome://tracing``) and the profiler stops; ``traces`` lists the files written.
    ``trace_format="tensorboard"`` writes it with
    ``torch.profiler.tensorboard_trace_handler`` instead, as
    ``dir/rank{rank}.<time>.pt.trace.json``, the layout TensorBoard's profiler
    plugin (``torch-tb-profiler``) reads: ``dir`` is a run, ``tensorboard --logdir``
    its parent. Perfetto opens that file too.
    The ranges stay on every call, for a profiler or ``nsys`` of your own.
    ``warmup=0`` is allowed, but torch warns that it can skew the results.
    """

    def __init__(self, events: Any = ("step", "loss", "backward", "optimizer_step"), dir: Any = "profile",
                 step_event: str = "step", wait: int = 1, warmup: int = 1, active: int = 3,
                 fit_event: str | None = DefaultEvent("fit"), trace_format: str = "chrome") -> None:
        import torch

        events = event_names(events, "Profiler")
        if not isinstance(dir, (str, os.PathLike)) or not os.fspath(dir):
            raise SettingError(f"Profiler: dir must be a folder path, got {dir!r}.")
        if not isinstance(step_event, str) or not step_event:
            raise SettingError(f"Profiler: step_event must be a join point name, got {step_event!r}.")
        for name, value in (("wait", wait), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SettingError(f"Profiler: {name} must be a whole number >= 0, got {value!r}.")
        if trace_format not in TRACE_FORMATS:
            raise SettingError(f"Profiler: trace_format must be one of {', '.join(map(repr, TRACE_FORMATS))}, "
                               f"got {trace_format!r}.")
        self.trace_format = trace_format
        self.events: tuple[str, ...] = events
        self.dir, self.step_event, self.fit_event = anchored(dir), step_event, fit_event
        self.wait, self.warmup = wait, warmup
        self.active = whole_number(active, "active", "Profiler")
        self.nvtx = torch.cuda.is_available()
        self.traces: list[str] = []  # the trace files written
        self._prof: Any = None  # the running torch.profiler.profile
        self._done = False  # the window has been profiled

    label = ("events",)

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        pairs = self.registrations(target, _STARTS)
        for event in self.events:  # a range of its own name each: built here, not declared
            jps = join_points(target, event, where=self.where)
            method, function = self._range_method(event), self._range_function(event)
            pairs.append((f"around-{event}", around_advice(jps, self.where, method, function)))
        return pairs + self.registrations(target, _ENDS)

    def _range_function(self, event: str) -> Callable[..., Any]:
        name = f"hookwrap:{event}"

        def ranged(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            import torch

            with torch.profiler.record_function(name), \
                    (torch.cuda.nvtx.range(name) if self.nvtx else contextlib.nullcontext()):
                return proceed(*args, **kwargs)

        return ranged

    def _range_method(self, event: str) -> Callable[..., Any]:
        ranged = self._range_function(event)

        def ranged_method(obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return ranged(proceed, *args, **kwargs)

        return ranged_method

    def _start(self, obj: Any) -> None:
        if self._prof is not None or self._done:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._write)
        self._prof.start()

    def _step(self, obj: Any) -> None:
        if self._prof is None:
            return
        self._prof.step()
        if self._done:  # the window's trace was written by this step
            self._stop()

    def _end(self, obj: Any) -> None:
        if self._prof is not None:  # fit ended inside the window: write what was recorded
            self._stop()

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        self._done = True
        prof.stop()

    def _write(self, prof: Any) -> None:
        folder = os.fspath(self.dir)
        os.makedirs(folder, exist_ok=True)
        if self.trace_format == "chrome":
            path = os.path.join(folder, f"trace_rank{process_rank()}.json")
            prof.export_chrome_trace(path)
        else:  # torch's own handler, so the layout is the one its TensorBoard plugin reads
            import torch

            worker = f"rank{process_rank()}"
            before = set(os.listdir(folder))
            torch.profiler.tensorboard_trace_handler(folder, worker_name=worker)(prof)
            # Its name: "<worker>.<time_ns>.pt.trace.json"; other ranks may write beside it.
            new = sorted(name for name in set(os.listdir(folder)) - before if name.startswith(worker + "."))
            path = os.path.join(folder, new[-1])
        self.traces.append(path)
        self._done = True
