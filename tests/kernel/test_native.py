"""The optional C accelerators: every ``_*.c`` source is built where a C compiler is, and
``DELTATAP_NATIVE`` turns them off (the pure-Python references run)."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deltatap.core import native

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"proxy": "deltatap.proxy", "loadgen": "deltatap.loadgen", "collector": "deltatap.collector", "stack": "deltatap.stack"}


def _sources() -> list[tuple[str, Path]]:
    """(module name, source) of every accelerator source in the tree, named as setup.py names them."""
    out = []
    for src in sorted(ROOT.glob("**/_*.c")):
        rel = src.relative_to(ROOT)
        if rel.parts[0] in (".venv", "build", "tests", "benchmarks"):
            continue
        top = FOLDERS.get(rel.parts[0], rel.parts[0])
        out.append((".".join([top, *rel.parts[1:-1], src.stem]), src))
    return out


def test_there_are_accelerators() -> None:
    assert _sources(), "no _*.c accelerator sources found"


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler: the references run")
@pytest.mark.parametrize("module", [m for m, _ in _sources()])
def test_every_accelerator_is_built(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{module} is not built ({exc}); rebuild with: .venv/bin/pip install -e '.[test]'")


def _load_in_child(setting: str | None, module: str) -> str:
    env = {"PATH": "/usr/bin:/bin"}
    if setting is not None:
        env["DELTATAP_NATIVE"] = setting
    code = f"from deltatap.core import native; print(native.load({module!r}, 'ref') is not None)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_native_setting_turns_accelerators_off_and_on() -> None:
    built = [m for m, _ in _sources() if importlib.util.find_spec(m) is not None]
    if not built:
        pytest.skip("no accelerator built here")
    module = built[0]
    short = module.rsplit(".", 1)[-1].lstrip("_")
    assert _load_in_child(None, module) == "True"
    assert _load_in_child("0", module) == "False"
    assert _load_in_child(short, module) == "True"
    assert _load_in_child("someotherone", module) == "False"


def test_status_reports_each_loaded_accelerator() -> None:
    built = [m for m, _ in _sources() if importlib.util.find_spec(m) is not None]
    if not built:
        pytest.skip("no accelerator built here")
    native.load(built[0], "tests.kernel.test_native")
    assert native.status()[built[0]] in ("used", "off")
    assert native.ACCELERATORS[built[0]] == "tests.kernel.test_native"
