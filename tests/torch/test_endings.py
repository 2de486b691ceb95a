"""The endings a cluster uses, and what no loop shape pays (issue 41, items 3 and 4):
a termination signal delivers what deferring callbacks hold and then ends the
process as the signal would have (or runs the program's own handler); a check that
fails at interpreter exit makes the exit status non-zero; the outermost running
``fit`` of any object settles the objects it drove; and no loop shape reads the
device back once per step. docs/design/decisions.md, "Deferring callbacks settle
at boundaries that always come"."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

needs_sigterm = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")


def losses_in(path: Path) -> list[float]:
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [float(row["value"]) for row in csv.DictReader(f) if row["name"] == "loss"]


def run_child(hw: Any, tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          timeout=120)


# The loop of each child: 7 losses held (flush_secs=None: written only at a boundary),
# then the signal arrives mid-run, as a scheduler sends it.
LOOP = """
import os, signal, sys, math, torch, hookwrap as hw
from hookwrap.torch import MetricsLogger, NanGuard

class Loop(hw.Hookable):
    @hw.hookable
    def fit(self, steps):
        for i in range(steps):
            self.step(i)

    @hw.hookable
    def step(self, i):
        self.loss(torch.tensor(float(i + 1)))
        if i == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's, mid-run
            for _ in range(1000):  # the handler runs between two bytecodes
                pass
            print("still running after SIGTERM", flush=True)

    @hw.hookable
    def loss(self, value):
        return value
"""


@needs_sigterm
@pytest.mark.parametrize("shape", ["fit", "no fit"])
def test_sigterm_mid_run_writes_every_row_and_ends_with_the_signals_status(hw, tmp_path, shape):
    path = tmp_path / "m.csv"
    done = run_child(hw, tmp_path, LOOP + f"""
loop = Loop()
loop.add_callback(MetricsLogger({str(path)!r}, tensorboard=False, flush_secs=None))
if sys.argv[1] == "fit":
    loop.fit(20)
else:  # the loop drives the steps itself: no fit runs
    for i in range(20):
        loop.step(i)
""", shape)
    assert done.returncode == -signal.SIGTERM, done.stderr  # as without hookwrap: killed by the signal
    assert "still running" not in done.stdout
    assert losses_in(path) == [float(i + 1) for i in range(7)]  # all 7 held rows


@needs_sigterm
def test_sigterm_runs_the_handler_the_program_installed_after_delivering(hw, tmp_path):
    """The program's own handler (installed before hookwrap's) still decides: here it
    ends the run with its own status; the rows arrived first."""
    path = tmp_path / "m.csv"
    done = run_child(hw, tmp_path, LOOP + f"""
def graceful(signum, frame):
    print("graceful shutdown, rows so far:", open({str(path)!r}).read().count("loss"), flush=True)
    sys.exit(7)

signal.signal(signal.SIGTERM, graceful)
loop = Loop()
loop.add_callback(MetricsLogger({str(path)!r}, tensorboard=False, flush_secs=None))
loop.fit(20)
""")
    assert done.returncode == 7, done.stderr
    assert "graceful shutdown, rows so far: 7" in done.stdout
    assert losses_in(path) == [float(i + 1) for i in range(7)]


@needs_sigterm
def test_a_handler_installed_after_hookwraps_that_chains_to_it_keeps_the_run_going(hw, tmp_path):
    """Lightning's SIGTERM handler calls the one it replaced, then lets its loop stop
    gracefully: hookwrap's then delivers, and leaves the ending to it."""
    path = tmp_path / "m.csv"
    done = run_child(hw, tmp_path, LOOP + f"""
loop = Loop()
loop.add_callback(MetricsLogger({str(path)!r}, tensorboard=False, flush_secs=None))
replaced = signal.getsignal(signal.SIGTERM)

def framework(signum, frame):  # notes the signal, chains to what it replaced
    replaced(signum, frame)
    print("noted", flush=True)

signal.signal(signal.SIGTERM, framework)
loop.fit(10)
print("ended gracefully", flush=True)
""")
    assert done.returncode == 0, done.stderr
    assert "noted" in done.stdout and "still running" in done.stdout and "ended gracefully" in done.stdout
    assert losses_in(path) == [float(i + 1) for i in range(10)]


@needs_sigterm
def test_a_checkpoint_on_signal_still_ends_with_its_system_exit(hw, tmp_path):
    """Checkpoint(on_signal=SIGTERM) saves after the step and ends the run with
    SystemExit(143), as before: hookwrap's own handler is passed over."""
    path = tmp_path / "m.csv"
    done = run_child(hw, tmp_path, LOOP + f"""
from hookwrap.torch import Checkpoint
loop = Loop()
loop.model = torch.nn.Linear(2, 1)
loop.add_callback(MetricsLogger({str(path)!r}, tensorboard=False, flush_secs=None))
loop.add_callback(Checkpoint({str(tmp_path / "ck")!r}, optimizer=None, on_signal=signal.SIGTERM))
loop.fit(20)
""")
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert (tmp_path / "ck" / "signal.pt").is_file()
    assert losses_in(path) == [float(i + 1) for i in range(7)]


# --- a failure found at exit, and trainers that drive each other ------------------------


INTERLEAVED = """
import math, sys, torch, hookwrap as hw
from hookwrap.torch import NanGuard

class Student(hw.Hookable):
    @hw.hookable
    def fit(self):  # never runs: the teacher drives the steps
        raise AssertionError("not called")

    @hw.hookable
    def step(self, value):
        return self.loss(torch.tensor(value))

    @hw.hookable
    def loss(self, value):
        return value

class Teacher(hw.Hookable):
    def __init__(self, student):
        self.student = student

    @hw.hookable
    def fit(self, values):
        for value in values:
            self.loss(torch.tensor(1.0))
            self.student.step(value)

    @hw.hookable
    def loss(self, value):
        return value

student = Student()
teacher = Teacher(student)
teacher.add_callback(NanGuard())
student.add_callback(NanGuard())
"""


def test_the_outermost_fit_settles_the_trainers_it_drove(hw, ht):
    """A teacher's fit drives a student's steps; the student's own fit never runs.
    Its NaN (fewer checks than check_every) stops the run at the end of the teacher's
    fit, not at interpreter exit."""
    class Student(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:  # never runs: the teacher drives the steps
            raise AssertionError("not called")

        @hw.hookable
        def step(self, value: float) -> Any:
            return self.loss(torch.tensor(value))

        @hw.hookable
        def loss(self, value: Any) -> Any:
            return value

    class Teacher(hw.Hookable):
        def __init__(self, student: Student) -> None:
            self.student = student

        @hw.hookable
        def fit(self, values: list[float]) -> None:
            for value in values:
                self.loss(torch.tensor(1.0))
                self.student.step(value)

        @hw.hookable
        def loss(self, value: Any) -> Any:
            return value

    student = Student()
    teacher = Teacher(student)
    teacher.add_callback(ht.NanGuard())
    student.add_callback(ht.NanGuard())
    with pytest.raises(ht.NonFiniteError, match=r"returned nan .*\(Student\)"):
        teacher.fit([1.0, 1.0, math.nan])


def test_a_nan_found_only_at_interpreter_exit_makes_the_exit_status_non_zero(hw, tmp_path):
    """The student driven by a plain loop (its fit bypassed, nothing else running a
    fit): its last NaN is found at exit, said on stderr, and the process fails."""
    done = run_child(hw, tmp_path, INTERLEAVED + """
for value in (1.0, 1.0, math.nan):
    student.step(value)
print("loop done", flush=True)
""")
    assert "loop done" in done.stdout
    assert done.returncode == 1, done.stderr
    assert "at interpreter exit" in done.stderr and "NonFiniteError" in done.stderr
    assert "exiting with status 1" in done.stderr


def test_a_run_that_ends_cleanly_keeps_its_exit_status(hw, tmp_path):
    done = run_child(hw, tmp_path, INTERLEAVED + """
for value in (1.0, 1.0, 2.0):
    student.step(value)
sys.exit(0)
""")
    assert done.returncode == 0, done.stderr
    assert "status 1" not in done.stderr


# --- what no loop shape pays -------------------------------------------------------------


@pytest.mark.parametrize("shape", ["fit", "no fit", "fit bypassed"])
def test_two_hundred_steps_read_back_once_per_check_every_on_every_loop_shape(hw, ht, tmp_path, shape):
    """MetricsLogger and NanGuard at their defaults: one read per check_every (20)
    steps, whatever drives the steps; a plain loop used to read once per step."""
    from hookwrap.torch.readback import count_host_reads

    class Steps(hw.Hookable):
        @hw.hookable
        def step(self) -> Any:
            return self.loss(torch.rand(()))

        @hw.hookable
        def loss(self, value: Any) -> Any:
            return value

    class Loop(Steps):
        @hw.hookable
        def fit(self, steps: int) -> None:
            for _ in range(steps):
                self.step()

    loop = Steps() if shape == "no fit" else Loop()
    loop.add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))
    loop.add_callback(ht.NanGuard())
    with count_host_reads() as reads:
        if shape == "fit":
            loop.fit(200)
        else:  # a plain loop drives the steps
            for _ in range(200):
                loop.step()
    assert reads.count <= 200 // 20 + 1, reads  # every 20 checks (and the end of fit)
    hw.callback_state(loop)  # as a checkpoint takes it: what is held is delivered
    assert len(losses_in(tmp_path / "m.csv")) == 200  # and every row arrived


# --- one base for deciding later, open to users' callbacks ---------------------------------


def test_a_users_callback_on_the_shared_base_reads_at_its_points_and_before_a_checkpoint(hw, ht):
    """``DecidesAtReadBacks`` (NanGuard's and SpikeDetection's base) gives a user's
    callback the same points: a read every ``check_every`` values, none per step, and
    a decision before a checkpoint is written (one registry: ``readback.settle``)."""
    from hookwrap.torch.readback import DecidesAtReadBacks, count_host_reads, settle, shared

    class Ceiling(DecidesAtReadBacks, hw.Callback):
        check_every = 5

        def __init__(self) -> None:
            self.seen: list[float] = []

        def post_loss(self, trainer: Any, return_value: Any) -> Any:
            shared().put(return_value, self.seen.extend)
            self.queued(trainer)
            return return_value

        def _read_back(self, wait: bool) -> None:
            if not self._since:
                return
            self._since, self._due = 0, False
            shared().read(wait=True)
            if max(self.seen) > 5:
                raise hw.StopTraining(f"above the ceiling at loss {len(self.seen)}")

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Linear(2, 1)

        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

    loop, ceiling = Loop(), Ceiling()
    loop.add_callback(ceiling)
    with count_host_reads() as reads:
        for _ in range(20):
            loop.loss(1.0)
    assert reads.count == 4 and len(ceiling.seen) == 20  # every 5 values, none per call
    loop.loss(9.0)  # queued, not read
    with pytest.raises(hw.StopTraining, match="at loss 21"):
        settle(loop)  # what Checkpoint asks before it writes: the queued value is decided
