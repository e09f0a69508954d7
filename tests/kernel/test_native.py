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


def _sources() -> list[tuple[str, Path]]:
    """(module name, source) of every accelerator setup.py builds (read from setup.py itself)."""
    return [(m, Path(src)) for m, src in native.extensions(str(ROOT))]


def test_setup_builds_every_accelerator_source() -> None:
    """Every ``_*.c`` in a package folder is in setup.py's extension list, named after its package."""
    sources = _sources()
    assert sources, "setup.py builds no accelerator"
    found = {p.relative_to(ROOT) for p in ROOT.glob("**/_*.c") if p.relative_to(ROOT).parts[0] not in (".venv", "build", "tests", "benchmarks")}
    assert {src.relative_to(ROOT) for _, src in sources} == found
    for module, src in sources:
        assert module.startswith("deltatap.") and module.endswith("." + src.stem)


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


def test_the_check_command_names_each_accelerator() -> None:
    """``python -m deltatap.core.native SOURCE_ROOT`` (the Dockerfile's build check) lists every accelerator."""
    proc = subprocess.run([sys.executable, "-m", "deltatap.core.native", str(ROOT)], capture_output=True, text=True, timeout=60)
    for module, _ in _sources():
        assert module in proc.stdout
    built = all(importlib.util.find_spec(m) is not None for m, _ in _sources())
    assert proc.returncode == (0 if built else 1), proc.stdout + proc.stderr
