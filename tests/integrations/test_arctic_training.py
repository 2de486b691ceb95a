"""hookwrap.integrations.arctic_training against ArcticTraining's released code.

ArcticTraining publishes wheels only (no sdist, so not its tests): the test takes
the arctic-training wheel from PyPI (pip's cache), unpacks its callback mixin
(``arctic_training/callback/``, with ``arctic_training.logging`` replaced by a
recording logger: the real one imports deepspeed), and runs the scenarios of
``_arctic_training_scenarios.py`` on it and on the drop-in, in each dispatch
twin, in subprocesses. Every scenario must give the same result, except the
differences the integrations guide documents (DIFFERENCES). Nothing of
ArcticTraining is kept in this repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.third_party

VERSION = "0.8.0"
HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "_arctic_training_scenarios.py"

# scenario: (ArcticTraining's result, the drop-in's); docs/guide/integrations.md
# ("ArcticTraining") says why each differs.
DIFFERENCES: dict[str, tuple[Any, Any]] = {
    # ArcticTraining's base wrapper runs the callbacks again inside super().step().
    "super_call": ([3, [1, 2]], [2, [1]]),
    # Its docs' example: there, A's callback runs only if TrainerA had an instance
    # before TrainerB was defined (callback methods are gathered at instantiation).
    "docs_inheritance": (
        ["Trainer B post epoch callback 1", "Trainer B post epoch callback 2"],
        ["Trainer A post epoch callback", "Trainer B post epoch callback 1", "Trainer B post epoch callback 2"],
    ),
    # It tests `"pre" in event`: post-predict is taken for a pre callback, refused.
    "post_predict": (["raises", "ValueError"], 6),
}


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder importing ``arctic_training.callback.mixin`` from the released wheel."""
    tmp = tmp_path_factory.mktemp("arctic_training")
    subprocess.run([sys.executable, "-m", "pip", "download", f"arctic-training=={VERSION}", "--no-deps",
                    "--only-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(tmp / "dl")],
                   check=True, timeout=300)
    wheel, = (tmp / "dl").glob("arctic_training-*.whl")
    root = tmp / "src"
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if n.startswith("arctic_training/callback/") and n.endswith(".py")]
        assert {"arctic_training/callback/mixin.py", "arctic_training/callback/callback.py"} <= set(members)
        z.extractall(root, members)
    (root / "arctic_training" / "__init__.py").write_text("")
    # loguru's logger.info(message) etc., recorded for the scenarios to compare.
    (root / "arctic_training" / "logging.py").write_text(
        "records = []\n\n\n"
        "class _Recording:\n"
        "    def __getattr__(self, level):\n"
        "        return lambda message, *args, **kwargs: records.append([level.upper(), message])\n\n\n"
        "logger = _Recording()\n")
    return root


def _run(*args: str, pure: bool = False) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("HOOKWRAP_NO_EXTENSIONS", None)
    # ArcticTraining's ordering log walks a set of strings: the same order on both sides.
    env["PYTHONHASHSEED"] = "0"
    if pure:
        env["HOOKWRAP_NO_EXTENSIONS"] = "1"
    done = subprocess.run([sys.executable, str(SCENARIOS), *args], env=env, cwd=HERE, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("twin", ["c-extension-module", "pure-python-module"])
def test_the_drop_in_does_what_arctic_training_does(released: Path, twin: str) -> None:
    theirs = _run("at", str(released))["results"]
    ran = _run("hookwrap", str(released), pure=twin == "pure-python-module")
    if twin == "c-extension-module" and not ran["using_extension"]:
        if os.environ.get("HOOKWRAP_REQUIRE_EXTENSIONS"):
            pytest.fail("the compiled hookwrap._fast did not load (HOOKWRAP_REQUIRE_EXTENSIONS is set)")
        pytest.skip("hookwrap._fast is not built")
    assert ran["using_extension"] == (twin == "c-extension-module")
    ours = ran["results"]
    assert set(ours) == set(theirs) and len(ours) >= 30
    assert sum(name.startswith("methods[") for name in ours) == 12  # the kinds of method, 2 classes
    for name, expected in DIFFERENCES.items():
        assert (theirs[name], ours[name]) == expected, name
    same = {name: theirs[name] for name in theirs if name not in DIFFERENCES}
    assert {name: ours[name] for name in same} == same
