"""MetricsLogger sending to third-party loggers, unchanged: Lightning's CSVLogger and
TensorBoardLogger (the thirdparty extra), W&B offline through Lightning's
WandbLogger, and MLflow's own module on a local file store (the loggers extra).
Each reads back what the logger wrote and compares it with the loop's losses."""

from __future__ import annotations

import csv
import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from .test_loggers import losses_by_hand, make_loop

pytestmark = [pytest.mark.third_party]

torch = pytest.importorskip("torch", reason="needs the torch extra")


def lightning_loggers() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's import-time deprecations are not ours to test
        return pytest.importorskip("lightning.pytorch.loggers", reason="needs the thirdparty extra (lightning)")


def expected(epochs: int = 2) -> list[tuple[int, str, float]]:
    """(step, name, value) the loop of test_loggers logs: 3 steps an epoch."""
    losses = losses_by_hand(3, epochs)
    rows = []
    for epoch in range(epochs):
        rows += [(3 * epoch + i + 1, "loss", losses[3 * epoch + i]) for i in range(3)]
        rows.append((3 * epoch + 3, "val_loss", 1.0 / (epoch + 1)))
    return rows


def test_lightning_csv_and_tensorboard_loggers_plug_in_unchanged(hw, ht, tmp_path):
    loggers = lightning_loggers()
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    csv_logger = loggers.CSVLogger(tmp_path, name="csv")
    tb_logger = loggers.TensorBoardLogger(tmp_path, name="tb")
    loop = make_loop(hw)
    loop.add_callback(ht.MetricsLogger(loggers=[csv_logger, tb_logger]))
    loop.fit(2)
    with open(Path(csv_logger.log_dir) / "metrics.csv", newline="", encoding="utf-8") as f:
        written = [(int(row["step"]), name, float(value)) for row in csv.DictReader(f)
                   for name, value in row.items() if name != "step" and value != ""]
    # float32 losses round-trip exactly through the CSV's repr of a float
    assert written == expected()
    events = EventAccumulator(tb_logger.log_dir)
    events.Reload()
    read = sorted((event.step, tag, event.value) for tag in events.Tags()["scalars"]
                  for event in events.Scalars(tag))
    want = sorted(expected())
    assert [(step, tag) for step, tag, _ in read] == [(step, tag) for step, tag, _ in want]
    assert [value for _, _, value in read] == pytest.approx([value for _, _, value in want], rel=1e-6)


def _wandb_records(path: Path) -> list[Any]:
    """The records of an offline W&B run's ``.wandb`` file: a header (":W&B", magic,
    version), then LevelDB-log chunks (32 KiB blocks; each chunk crc32, length,
    type) holding protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows of a finished offline run. wandb.finish() can return
    before wandb's service has written the file out: wait for the run's exit record."""
    path = next(run_dir.glob("run-*.wandb"))
    deadline = time.monotonic() + 30
    while True:
        records = _wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_wandb_offline_through_lightnings_wandb_logger(hw, ht, tmp_path, monkeypatch):
    loggers = lightning_loggers()
    wandb = pytest.importorskip("wandb", reason="needs the loggers extra (wandb)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = loggers.WandbLogger(offline=True, save_dir=str(tmp_path), project="hookwrap")
    loop = make_loop(hw)
    loop.add_callback(ht.MetricsLogger(loggers=[logger]))
    loop.fit(2)
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()  # Lightning's finalize leaves the run open (wandb closes it at exit)
    history = _wandb_history(run_dir)
    logged = [(row["trainer/global_step"], name, value) for row in history
              for name, value in row.items() if not name.startswith(("_", "trainer/"))]
    assert logged == expected()
    assert [row["_step"] for row in history] == list(range(8))  # one wandb step per call: 6 losses, 2 evals


def test_mlflow_module_on_a_local_file_store(hw, ht, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="needs the loggers extra (mlflow-skinny)")
    # MLflow 3 keeps its file store only on request (a database or a server is its default).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run() as run:
            loop = make_loop(hw)
            loop.add_callback(ht.MetricsLogger(loggers=[mlflow]))  # the module's own log_metrics
            loop.fit(2)
    finally:
        mlflow.set_tracking_uri(None)
    client = mlflow.MlflowClient(tracking_uri=uri)
    read = [(m.step, name, m.value) for name in ("loss", "val_loss")
            for m in client.get_metric_history(run.info.run_id, name)]
    assert sorted(read) == sorted(expected())


def test_lightnings_mlflow_logger_on_a_local_file_store(hw, ht, tmp_path, monkeypatch):
    loggers = lightning_loggers()
    mlflow = pytest.importorskip("mlflow", reason="needs the loggers extra (mlflow-skinny)")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    logger = loggers.MLFlowLogger(experiment_name="hookwrap", tracking_uri=uri)
    loop = make_loop(hw)
    loop.add_callback(ht.MetricsLogger(loggers=[logger]))
    loop.fit(2)
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"  # finalize("success") ended it
    read = [(m.step, name, m.value) for name in ("loss", "val_loss")
            for m in client.get_metric_history(logger.run_id, name)]
    assert sorted(read) == sorted(expected())


def test_a_logger_sending_to_the_mlflow_module_copies_and_pickles(hw, ht):
    import copy
    import pickle

    mlflow = pytest.importorskip("mlflow", reason="needs the loggers extra (mlflow-skinny)")
    logger = ht.MetricsLogger(loggers=[mlflow])
    assert copy.deepcopy(logger).loggers == [mlflow]  # a module goes by its name
    assert pickle.loads(pickle.dumps(logger)).loggers == [mlflow]
    assert logger.state_key == "MetricsLogger[mlflow]"


@pytest.mark.parametrize("given", ["run", "module"])
def test_wandb_offline_with_no_lightning_a_run_or_the_module(hw, ht, tmp_path, monkeypatch, given):
    """loggers=[wandb.init(...)] or loggers=[wandb]: the rows W&B holds are those
    Lightning's WandbLogger sends (the step as global_step)."""
    import pickle

    wandb = pytest.importorskip("wandb", reason="needs the loggers extra (wandb)")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="hookwrap")
    try:
        logger = ht.MetricsLogger(loggers=[run if given == "run" else wandb])
        if given == "module":
            assert pickle.loads(pickle.dumps(logger.loggers[0])).run is wandb
        loop = make_loop(hw)
        loop.add_callback(logger)
        loop.fit(2)
        run_dir = Path(run.dir).parent
    finally:
        wandb.finish()
    history = _wandb_history(run_dir)
    logged = [(row["global_step"], name, value) for row in history
              for name, value in row.items() if not name.startswith("_") and name != "global_step"]
    assert logged == expected()
