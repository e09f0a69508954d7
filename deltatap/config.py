"""Strict, typed configuration loading shared by every package.

Models derive from :class:`StrictModel` (unknown keys are errors). :func:`load_yaml` turns every
failure into one :class:`ConfigError` that names the file, the key path and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration problem, with a message a user can act on."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, populate_by_name=True)


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (misspelt? see docs/reference.md)"
        got = e.get("input")
        got_s = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"  - {loc}: {msg}{got_s}")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> Any:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None


def validate(model: type[M], data: Any, source: str) -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_yaml(path: str | Path, model: type[M], section: str | None = None) -> M:
    """Load ``path`` (optionally one top-level ``section`` of it) into ``model``."""
    data = read_yaml(path)
    source = str(path)
    if section is not None:
        if not isinstance(data, dict) or section not in data:
            raise ConfigError(f"{path}: missing top-level key {section!r}")
        data = data[section]
        source = f"{path} [{section}]"
    return validate(model, data, source)
