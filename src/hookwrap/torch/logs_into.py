"""A callback that logs its values into a ``MetricsLogger`` (GradNorm, LRMonitor,
MemoryMonitor, Throughput): the logger it is given, checked and wrapped
(``checked_logger``), the name it logs under, and settling the logger at the
callback's own boundaries (``LogsInto``)."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from ..errors import HookError, SettingError
from ..extend import Defers, Ending
from .metrics_logger import LogRecords, MetricsLogger

__all__ = ["LogsInto", "checked_logger", "logged_name", "settle_logger"]


# id(logger) -> the MetricsLogger wrapping it (checked_logger), while a callback holds it.
_wrappers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def checked_logger(logger: Any, where: str) -> Any:
    """``logger`` as the callbacks log into it: ``None``; a ``MetricsLogger`` itself; any
    other object with ``log_metrics(metrics, step)`` (the one logger protocol of
    hookwrap.torch: Lightning's loggers, the ``mlflow`` module, a class of yours), or a
    ``logging.Logger`` (an INFO record a step: ``LogRecords``), inside a
    ``MetricsLogger(loggers=[logger])`` of its own, so its values are read back in
    batches and nothing is lost at the end of the run. Else a HookError naming the
    setting: a class, an object without ``log_metrics``."""
    if logger is None:
        return None
    if isinstance(logger, MetricsLogger):
        return logger
    if isinstance(logger, logging.Logger) or (
            not isinstance(logger, type) and callable(getattr(logger, "log_metrics", None))):
        # One wrapper per logger, whichever callbacks share it: its rows go in step order,
        # and it is finalized once.
        wrapper = _wrappers.get(id(logger))
        sink = wrapper.loggers[0] if wrapper is not None else None
        if sink is None or (sink.logger if isinstance(sink, LogRecords) else sink) is not logger:
            wrapper = _wrappers[id(logger)] = MetricsLogger(loggers=[logger])
        return wrapper
    what = (f"the class {logger.__qualname__}, not an instance" if isinstance(logger, type)
            else f"{logger!r} ({type(logger).__name__}), which has no log_metrics method")
    raise SettingError(f"{where}: logger must be a hookwrap.torch.MetricsLogger, an object with "
                       f"log_metrics(metrics: dict[str, float], step: int), such as Lightning's loggers or the "
                       f"mlflow module, or a logging.Logger; got {what}.")


class LogsInto(Defers):
    """A callback whose ``logger`` (a MetricsLogger, see ``checked_logger``) may hold
    its values: it defers when it has one, and its boundaries settle the logger
    (which may not be attached itself)."""

    logger: Any

    def defers(self) -> bool:
        return self.logger is not None

    def settle(self, obj: Any, ending: Ending) -> None:
        settle_logger(self.logger, obj, ending)


def logged_name(name: Any, where: str) -> str:
    """The name a callback logs its values under (a column of the logger's rows)."""
    if not isinstance(name, str) or not name:
        raise HookError(f"{where}: name is the name its values are logged under, a non-empty string such as "
                        f"'grad_norm', got {name!r}.")
    return name


def settle_logger(logger: Any, obj: Any, ending: Any) -> None:
    """At a boundary of a callback that logs into ``logger`` (a MetricsLogger): what it
    logged is settled there too, as ``logger`` itself may not be attached."""
    settle = getattr(logger, "settle", None)
    if settle is not None:
        settle(obj, ending)
