"""LayerStats: each parameter's gradient norm and weight norm, logged every N steps,
with one read-back per interval; the values Lightning's grad_norm utility gives."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")


def _loop(hw: Any) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        @hw.hookable
        def step(self, x: Any, y: Any) -> None:
            self.optimizer.zero_grad()
            self.backward(torch.nn.functional.mse_loss(self.model(x), y))
            self.optimizer.step()

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

    return Loop()


def test_each_layers_norms_every_n_steps_as_computed_by_hand(hw, ht, tmp_path):
    loop = _loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    hw.add_callback(loop, ht.LayerStats(every=3, logger=logger))
    hw.add_callback(loop, ht.GradNorm(logger=logger))  # beside it: its total under "grad_norm"

    expected: dict[tuple[int, str], Any] = {}
    g = torch.Generator().manual_seed(1)
    with ht.count_host_reads() as reads:
        for step in range(1, 7):
            x, y = torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)
            loop.step(x, y)
            if step % 3 == 0:
                for name, p in loop.model.named_parameters():
                    expected[(step, f"grad_norm/{name}")] = p.grad.norm()  # read after counting
        logger.close()
    rows = [line.split(",") for line in (tmp_path / "m.csv").read_text().splitlines()[1:]]
    got = {(int(step), name): float(value) for step, name, value in rows if name.startswith("grad_norm/")}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), rel=1e-6), key
    weights = {(int(step), name) for step, name, _ in rows if name.startswith("weight_norm/")}
    assert weights == {(s, f"weight_norm/{n}") for s in (3, 6) for n in ("0.weight", "0.bias", "2.weight", "2.bias")}
    assert [int(step) for step, name, _ in rows if name == "grad_norm"] == [1, 2, 3, 4, 5, 6]
    assert reads.count <= 2  # every value queued, read back together (not one read per layer)


def test_the_values_of_lightnings_grad_norm_utility(hw, ht, tmp_path):
    pytest.importorskip("lightning", reason="needs the thirdparty extra (lightning)")
    from lightning.pytorch.utilities import grad_norm

    loop = _loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    hw.add_callback(loop, ht.LayerStats(every=1, logger=logger, weights=False))

    loop.optimizer.step = lambda: None  # the gradients stay as measured
    loop.step(torch.ones(8, 3), torch.zeros(8, 1))
    logger.close()
    theirs = {name.split("/", 1)[1]: float(value) for name, value in grad_norm(loop.model, 2).items()
              if name != "grad_2.0_norm_total"}
    rows = [line.split(",") for line in (tmp_path / "m.csv").read_text().splitlines()[1:]]
    ours = {name.split("/", 1)[1]: float(value) for _, name, value in rows}
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-4), name


def test_without_a_logger_it_is_refused_naming_it(hw, ht):
    with pytest.raises(hw.SettingError, match="pass logger=MetricsLogger"):
        hw.add_callback(_loop(hw), ht.LayerStats())


def _histograms(folder: Any) -> dict[tuple[str, int], tuple[float, float, float, float, list[float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"histograms": 0})
    events.Reload()
    return {(tag, event.step): (event.histogram_value.min, event.histogram_value.max, event.histogram_value.num,
                                event.histogram_value.sum, list(event.histogram_value.bucket))
            for tag in events.Tags()["histograms"] for event in events.Histograms(tag)}


def test_histograms_are_those_tensorboard_makes_of_each_gradient_and_weight(hw, ht, tmp_path):
    """histograms=True, every 2 steps: in TensorBoard, grads/<parameter> and
    weights/<parameter> at steps 2 and 4, each the histogram SummaryWriter makes of
    that parameter's gradient (and values) as they were then, written here by hand
    (what ignite's GradsHistHandler and WeightsHistHandler write); one copy to the
    host an interval."""
    pytest.importorskip("tensorboard", reason="needs tensorboard (the test extra)")
    from torch.utils.tensorboard import SummaryWriter

    loop = _loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=tmp_path / "ours")
    hw.add_callback(loop, ht.LayerStats(every=2, logger=logger, histograms=True))
    by_hand = SummaryWriter(str(tmp_path / "theirs"))
    seen = {"step": 0}

    def record(self: Any, loss: Any) -> None:  # after backward: the gradients LayerStats sees
        seen["step"] += 1
        if seen["step"] % 2 == 0:
            for name, p in self.model.named_parameters():
                by_hand.add_histogram(f"grads/{name}", p.grad.detach().cpu(), seen["step"])
                by_hand.add_histogram(f"weights/{name}", p.detach().cpu(), seen["step"])

    hw.after(loop, "backward", record)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        loop.step(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g))
    logger.close()
    by_hand.close()
    ours, theirs = _histograms(tmp_path / "ours"), _histograms(tmp_path / "theirs")
    assert len(theirs) == 2 * 4 * 2  # 4 parameters, gradients and weights, steps 2 and 4
    assert ours == theirs
    # The copy to the host: one per interval for all the parameters (then binned there).
    loop = _loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m2.csv", tensorboard=tmp_path / "again")
    hw.add_callback(loop, ht.LayerStats(every=2, logger=logger, histograms=True))
    with ht.count_host_reads() as reads:
        for _ in range(4):
            loop.step(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g))
    assert reads.by_method == {"cpu": 2, "numpy": 2}, reads  # (the norms are read later, queued)
    logger.close()


def test_histograms_without_tensorboard_are_refused_naming_the_fix(hw, ht, tmp_path):
    loop = _loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    with pytest.raises(hw.SettingError, match=r"histograms=True sends TensorBoard histograms.*tensorboard="):
        hw.add_callback(loop, ht.LayerStats(logger=logger, histograms=True))
