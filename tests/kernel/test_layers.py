"""The floors of the one namespace: each imports only the floors below it (read from the source, every import
statement, including those inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# floor -> (its folder, the deltatap packages it may import)
FLOORS = {
    "deltatap.core": (ROOT / "deltatap" / "core", {"deltatap.core"}),
    "deltatap.net": (ROOT / "deltatap" / "net", {"deltatap.core", "deltatap.net"}),
    # (the span export is a network client: its OTLP/HTTP answers are framed by the network layer's HTTP/1.1 reader)
    "deltatap.telemetry": (ROOT / "deltatap" / "telemetry", {"deltatap.core", "deltatap.net", "deltatap.telemetry"}),
}
UPPER = ("deltatap.proxy", "deltatap.loadgen", "deltatap.collector", "deltatap.stack", "deltatap.app")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] if node.module != "deltatap" else [f"deltatap.{a.name}" for a in node.names]
    return [m for m in out if m == "deltatap" or m.startswith("deltatap.")]


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_a_floor_imports_only_the_floors_below(floor):
    folder, allowed = FLOORS[floor]
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for mod in _imports(path):
            if mod in ("deltatap", "deltatap.__version__"):
                continue
            if not any(mod == a or mod.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_package_root_imports_nothing_above_it():
    assert _imports(ROOT / "deltatap" / "__init__.py") == []


def test_no_package_uses_the_old_top_level_names():
    bad = []
    for folder in ("deltatap", "proxy", "loadgen", "collector", "stack", "tests", "benchmarks", "realstack"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
                bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("proxy", "loadgen", "collector", "stack")]
    assert not bad, "\n".join(bad)
