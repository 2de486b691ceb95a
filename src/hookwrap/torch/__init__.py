"""Callbacks for PyTorch training loops, for any hookable loop.

Each attaches to join points by name (defaults for a conventional loop: ``step``,
``loss``, ``backward``, ``optimizer_step``, ``epoch``, ``evaluate``, ``fit``) and
reads values by argument name or ``return_value``, so the same callback works on
your own loop, the example trainer or a woven third-party trainer:

    trainer.add_callback(NanGuard())
    trainer.add_callback(EarlyStopping(monitor="val_loss", patience=3))

Needs torch (and tqdm for ``ProgressBar``): ``pip install "hookwrap[torch]" torch``.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without torch installed
    raise ImportError(
        "hookwrap.torch needs PyTorch: pip install 'hookwrap[torch]' torch "
        "(pin the torch version you want, e.g. torch==2.13.0, on the same command line)."
    ) from exc

from .autocast import Autocast
from .checkpoint import BestCheckpoint
from .checkpoint import Checkpoint
from .distributed import all_ranks_mean
from .distributed import any_rank
from .distributed import is_distributed
from .distributed import per_rank
from .distributed import ranks_where
from .early_stopping import EarlyStopping
from .grad_scaler import GradScaler
from .ema import EMA
from .evaluate_first import EvaluateFirst
from .loop_changes import GradAccumulation
from .loop_changes import GradClip
from .memory import MemoryMonitor
from .metrics_logger import CSVWriter
from .metrics_logger import LogRecords
from .metrics_logger import MetricsLogger
from .metrics_logger import MetricsSink
from .metrics_logger import TensorBoardWriter
from .monitors import GradNorm
from .monitors import LRMonitor
from .monitors import LayerStats
from .nan_guard import NanGuard
from .nan_guard import NonFiniteError
from .profiler import Profiler
from .progress import ProgressBar
from .readback import HostReads
from .readback import ReadBack
from .readback import count_host_reads
from .scheduler import StepScheduler
from .skip_bad_steps import Rollback
from .skip_bad_steps import SkipBadSteps
from .spike import SpikeDetection
from .spike import TrainingSpikeError
from .steps import counts_updates
from .throughput import Throughput
from .throughput import measure_flops
from .throughput import peak_flops
from .time_limit import TimeLimit
from .timer import StepTimer

__all__ = [
    "Autocast",
    "BestCheckpoint",
    "CSVWriter",
    "Checkpoint",
    "EMA",
    "EarlyStopping",
    "EvaluateFirst",
    "GradAccumulation",
    "GradClip",
    "GradNorm",
    "GradScaler",
    "HostReads",
    "LRMonitor",
    "LayerStats",
    "LogRecords",
    "MemoryMonitor",
    "MetricsLogger",
    "MetricsSink",
    "NanGuard",
    "NonFiniteError",
    "Profiler",
    "ProgressBar",
    "ReadBack",
    "Rollback",
    "SkipBadSteps",
    "StepScheduler",
    "SpikeDetection",
    "StepTimer",
    "TensorBoardWriter",
    "Throughput",
    "TimeLimit",
    "TrainingSpikeError",
    "all_ranks_mean",
    "any_rank",
    "count_host_reads",
    "counts_updates",
    "is_distributed",
    "measure_flops",
    "peak_flops",
    "per_rank",
    "ranks_where",
]
