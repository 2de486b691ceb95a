"""``hookwrap trace``: on scripts shaped as nanoGPT's, word_language_model's and
dcgan's loops, it lists what each calls per step and prints a ``hookwrap run``
command that, run as printed, logs a CSV equal to what the script itself prints."""

from __future__ import annotations

import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the torch extra")

SCRIPTS = Path(__file__).parent / "scripts"


def _hookwrap(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hookwrap", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONHASHSEED="0"))


def _traced_then_run(name: str, tmp_path: Path, *args: str) -> tuple[str, str, list[tuple[int, str, float]]]:
    """The trace's report, the script's output under the command it proposes, and the
    CSV that command wrote."""
    shutil.copy(SCRIPTS / name, tmp_path / name)
    traced = _hookwrap("trace", name, *args, cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    command = shlex.split(traced.stdout.splitlines()[-1])
    assert command[:2] == ["hookwrap", "run"] and command[-len(args) - 1:] == [name, *args]
    assert not (tmp_path / "metrics.csv").exists()  # the trace itself logs nothing
    ran = _hookwrap(*command[1:], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = [(int(r["step"]), r["name"], float(r["value"])) for r in csv.DictReader(f)]
    return traced.stdout, ran.stdout, rows


def _printed(out: str, prefix: str) -> list[float]:
    return [float(x) for line in out.splitlines() if line.startswith(prefix) for x in line.split()[1:]]


def test_word_language_model_its_losses_and_its_evaluation(tmp_path):
    report, out, rows = _traced_then_run("word_language_model_like.py", tmp_path, "--epochs", "2")
    assert "torch.nn.functional:nll_loss  loss: 10 with gradients, 6 without" in report  # NLLLoss calls it
    assert "__main__:evaluate  computes a loss under torch.no_grad(): an evaluation" in report
    assert "--train-only loss --weave evaluate=__main__:evaluate --only 'evaluate: data_source is val_data'" in report
    assert [v for _, n, v in rows if n == "loss"] == _printed(out, "loss ")  # the training losses alone
    assert [v for _, n, v in rows if n == "metric"] == _printed(out, "val ")  # not the test set's at its end
    assert len(_printed(out, "test ")) == 1
    assert [s for s, n, _ in rows if n == "lr"] == list(range(1, 11))  # one per update
    page = (Path(__file__).parents[2] / "docs" / "guide" / "integrations.md").read_text()
    shown = page.split("```text\nper optimizer step (10 steps):\n", 1)[1].split("```", 1)[0]
    assert report.split("per optimizer step (10 steps):\n", 1)[1] == shown  # the page shows this very report


def test_nanogpt_its_micro_batch_losses_and_estimate_loss(tmp_path):
    report, out, rows = _traced_then_run("nanogpt_like.py", tmp_path)
    assert "torch.nn.functional:cross_entropy  loss: 14 with gradients, 12 without" in report
    assert "--weave evaluate=__main__:estimate_loss" in report and "__main__:GPT  " not in report
    assert [v for _, n, v in rows if n == "loss"] == _printed(out, "micro ")
    evaluations = [(int(m[1]), float(m[2]), float(m[3]))
                   for m in re.finditer(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", out)]
    assert len(evaluations) == 3
    for step, train, val in evaluations:  # at the update count the script prints, to its 4 decimals
        logged = {n: v for s, n, v in rows if s == step and n in ("train", "val")}
        assert (round(logged["train"], 4), round(logged["val"], 4)) == (train, val)


def test_dcgan_two_optimizers_each_its_own_learning_rate(tmp_path):
    report, out, rows = _traced_then_run("dcgan_like.py", tmp_path)
    assert "0.50  Adam.step  (optimizerD)" in report and "0.50  Adam.step  (optimizerG)" in report
    assert "--when 'obj is optimizerD'" in report and "evaluate=" not in report  # it evaluates nothing
    assert [v for _, n, v in rows if n == "loss"] == _printed(out, "losses ")  # D real, D fake, G: each call
    # MetricsLogger counts G's steps, the last of each iteration: the three losses of
    # iteration i share its number (counting both optimizers, they were at 2i, 2i, 2i+1).
    assert "--callback 'MetricsLogger(\"metrics.csv\")' --when 'obj is optimizerG'" in report
    assert [step for step, n, _ in rows if n == "loss"] == [i for i in range(4) for _ in range(3)]
    assert [v for _, n, v in rows if n == "lr_optimizerD"] == [2e-4] * 4
    assert [v for _, n, v in rows if n == "lr_optimizerG"] == [1e-4] * 4


def test_steps_stops_the_script_and_a_failing_script_is_its_own_error(tmp_path):
    shutil.copy(SCRIPTS / "word_language_model_like.py", tmp_path / "wlm.py")
    traced = _hookwrap("trace", "--steps", "3", "wlm.py", cwd=tmp_path)
    assert traced.returncode == 0 and traced.stdout.count("loss ") >= 3
    assert "stopped after 3 optimizer steps (--steps 3)" in traced.stdout
    assert "val " not in traced.stdout  # stopped before its evaluation: nothing after the third step ran
    assert "No evaluation was seen in these 3 steps" in traced.stdout and "--steps past it" in traced.stdout
    (tmp_path / "broken.py").write_text("raise RuntimeError('no data')\n")
    traced = _hookwrap("trace", "broken.py", cwd=tmp_path)
    assert traced.returncode == 1 and "RuntimeError: no data" in traced.stderr
    assert "broken.py ended with status 1 before it was traced" in traced.stderr


def test_a_trace_leaves_the_scripts_files_as_they_were(tmp_path):
    """The script saves its checkpoint each step (torch.save to a path, and through a
    file it opens): traced, the files of the run it would resume stay as they were,
    and the report names them."""
    (tmp_path / "saves.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(3):\n"
        "    loss = torch.nn.functional.mse_loss(model(torch.ones(4, 2)), torch.zeros(4, 1))\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch.save(model.state_dict(), 'ckpt.pt')\n"
        "    with open('best.pt', 'wb') as f:\n"
        "        torch.save(model, f)\n"
        "print('saved')\n")
    for name in ("ckpt.pt", "best.pt"):
        (tmp_path / name).write_bytes(b"the run's own")
    traced = _hookwrap("trace", "saves.py", cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    assert "saved" in traced.stdout  # it ran to its end
    assert "Its saves were skipped, so its files stay as they were: best.pt, ckpt.pt." \
        in traced.stdout
    assert (tmp_path / "ckpt.pt").read_bytes() == (tmp_path / "best.pt").read_bytes() == b"the run's own"
