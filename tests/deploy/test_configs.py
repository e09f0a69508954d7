"""Every YAML file under configs/ is validated against the config model it is written for.

A file is recognised by its shape (a registry of recognisers, first match wins); a YAML file that no
recogniser claims fails the test, so a new format cannot slip in unvalidated. Third-party component
configs shipped beside the example topologies (LiteLLM, Envoy AI Gateway, ...) are checked in
test_examples.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deltatap.core.config import ConfigError, read_yaml
from deltatap.core.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
# component configs of third-party software, next to the example topologies that use them
THIRD_PARTY_DIRS = ("examples/components",)


def _optional(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            return None
        raise


def _validate_topology(path: Path, data: Any) -> list[str]:
    topo = load_topology(path)
    assert isinstance(topo, Topology)
    return ["topology"]


def _validate_stack_sections(path: Path, data: dict) -> list[str]:
    """A combined file (configs/demo.yaml): topology plus one section per reference component."""
    done = []
    if "topology" in data:
        load_topology(path)
        done.append("topology")
    stack_config = _optional("deltatap.stack.config")
    kinds = [k for k in ("gateway", "firewall", "engine") if k in data]
    if kinds:
        if stack_config is None:
            pytest.skip(f"{path}: stack/ not in this checkout; cannot validate {kinds}")
        for kind in kinds:
            stack_config.load_component_config(path, kind)
            done.append(kind)
    return done


def _validate_workload(path: Path, data: dict) -> list[str]:
    workloads = _optional("deltatap.loadgen.workloads")
    if workloads is None:
        pytest.skip(f"{path}: loadgen/ not in this checkout")
    workloads.load_workload(str(path))
    return ["workload"]


# (name, does this file look like it, validate) - first match wins
RECOGNISERS: list[tuple[str, Callable[[Any], bool], Callable[[Path, Any], list[str]]]] = [
    ("topology", lambda d: isinstance(d, dict) and "components" in d and "links" in d, _validate_topology),
    (
        "stack",
        lambda d: isinstance(d, dict) and any(k in d for k in ("topology", "gateway", "firewall", "engine")),
        _validate_stack_sections,
    ),
    ("workload", lambda d: isinstance(d, dict) and "workload" in d, _validate_workload),
]


def _deltatap_yaml_files() -> list[Path]:
    skip = [CONFIGS / d for d in THIRD_PARTY_DIRS]
    files = sorted(p for p in CONFIGS.rglob("*.y*ml") if not any(s in p.parents for s in skip))
    return files


def test_there_are_configs_to_validate():
    assert (CONFIGS / "examples").is_dir()
    assert len(_deltatap_yaml_files()) >= 3


@pytest.mark.parametrize("path", _deltatap_yaml_files(), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_file_validates(path: Path):
    data = read_yaml(path)
    for name, matches, validate in RECOGNISERS:
        if matches(data):
            sections = validate(path, data)
            assert sections, f"{path}: recognised as {name} but nothing was validated"
            return
    pytest.fail(
        f"{path}: no validator recognises this file (top-level keys: {sorted(data) if isinstance(data, dict) else type(data).__name__}); "
        "add a recogniser to tests/deploy/test_configs.py for its format"
    )


def test_a_misspelt_key_is_caught(tmp_path: Path):
    """The validation above can fail: a typo in a copied example is reported with its key path."""
    src = (CONFIGS / "examples" / "vllm-litellm.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("listen:", "lisen:", 1), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_topology(bad)
    assert "lisen" in str(err.value) and "unknown key" in str(err.value)
