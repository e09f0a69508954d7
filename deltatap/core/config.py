"""Strict, typed configuration loading shared by every package.

Models derive from :class:`StrictModel` (unknown keys are errors). :func:`load_yaml` turns every
failure into one :class:`ConfigError` that names the file, the key path and what was expected.

A config is named by path or by name: :func:`find_config` looks a name up among the configs packaged with
deltatap (``configs/`` in the checkout, ``deltatap/configs`` in the wheel), so ``--config demo``,
``--config configs/demo.yaml`` and ``--workload chatbot`` work from any directory.
"""

from __future__ import annotations

import errno
import importlib.resources
import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration problem, with a message a user can act on."""


def os_error_line(exc: OSError) -> str:
    """One line for an OSError the environment raised (a path that cannot be read or written, a port in use):
    the path(s) it names and the system's reason."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno == errno.EEXIST:
        reason = "already exists and is not a directory (name a directory, or a new path)"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason += " (choose a path you can write, or fix its permissions)"
    paths = [str(f) for f in (exc.filename, exc.filename2) if f is not None]
    return f"{' -> '.join(paths)}: {reason}" if paths else reason


PROCESSES_PER_CPU = 4  # one process per core is the useful most; each is a whole interpreter (~75 MB)


def processes_allowed() -> int:
    """The most processes one command runs side by side on this host (``tap --workers``, ``load --processes``):
    :data:`PROCESSES_PER_CPU` per CPU this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return PROCESSES_PER_CPU * max(1, cpus)


def listen_error_line(flag: str, host: str | None, port: int | None, exc: OSError) -> str:
    """One line for a listening socket the system refused (``flag``: the option that named the address): the system's
    own reason (asyncio's "error while attempting to bind on address ..." wrapper taken off) and what to do."""
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc) or type(exc).__name__)
    if exc.errno == errno.EADDRINUSE:
        reason += "; another process listens there: stop it, or choose another port (0 takes a free one)"
    elif exc.errno in (errno.EACCES, errno.EPERM) and port is not None and 0 < port < 1024:
        reason += "; ports below 1024 need root or CAP_NET_BIND_SERVICE: choose a port of 1024 or more"
    elif exc.errno == errno.EADDRNOTAVAIL:
        reason += "; no interface of this machine has that address: 127.0.0.1 or 0.0.0.0?"
    return f"{flag} {host or '0.0.0.0'}:{port}: cannot listen ({reason})"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, populate_by_name=True)


def format_validation_error(err: ValidationError, source: str, names: dict[str, str] | None = None) -> str:
    """The lines of a pydantic refusal: one per field, ``loc: reason (got value)``. ``names``: what the user typed for
    a top-level field (a command's flags: ``{"duration_s": "--duration"}``), so a flag error names the flag."""
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        parts = [str(p) for p in e["loc"]]
        if names and parts and parts[0] in names:
            parts[0] = names[parts[0]]
        loc = ".".join(parts) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (misspelt? see docs/reference.md)"
        elif e["type"] == "value_error":  # (a validator's own words: pydantic's "Value error, " says nothing more)
            msg = msg.removeprefix("Value error, ")
        got = e.get("input")
        got_s = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"  - {loc}: {msg}{got_s}")
    return "\n".join(lines)


def check_output_file(path: str | Path, flag: str) -> Path:
    """Refuse, before a run starts, an output file that could not be written at its end: a directory, or a folder
    that does not exist or is not writable. Raises one :class:`ConfigError` naming ``flag``."""
    p = Path(path).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: a directory; name a file")
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable; choose a path you can write")
    return p


def check_output_dir(path: str | Path, flag: str) -> Path:
    """Refuse, before a run starts, an output folder that is a file or cannot be created; creates it."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {path}: already exists and is not a directory; name a directory, or a new path")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {os_error_line(exc)}") from None
    return p


# the sub-folders of the packaged configs that a bare name is looked up in, in this order
CONFIG_FOLDERS: tuple[str, ...] = ("", "workloads", "examples")


def packaged_configs() -> Path:
    """The folder of the configs shipped with deltatap (topologies, the demo, workloads, examples)."""
    return Path(str(importlib.resources.files("deltatap.configs")))


def packaged_config_names(folder: str = "") -> list[str]:
    """Names (file stems) of the packaged YAML configs in one folder ("" for the top level)."""
    base = packaged_configs() / folder
    return sorted(p.stem for p in base.glob("*.yaml")) if base.is_dir() else []


def find_config(ref: str | Path, folder: str | None = None) -> Path:
    """The file ``ref`` names: an existing path as given, else a packaged config by name.

    A name is ``demo``, ``demo.yaml``, ``workloads/chatbot`` or ``configs/demo.yaml`` (the checkout's
    relative path, so the docs' commands also work outside the checkout); ``folder`` limits the look-up to
    one packaged folder (``"workloads"``). A ref that is neither raises one :class:`ConfigError` that lists
    the packaged names."""
    p = Path(ref).expanduser()
    if p.exists() and not p.is_dir():  # (a folder of that name, e.g. an earlier `deltatap demo --out demo`, is no config)
        return p
    text = str(ref)
    rel = text[len("configs/"):] if text.startswith("configs/") else text
    folders = (folder,) if folder is not None else CONFIG_FOLDERS
    if not p.is_absolute() and rel:
        root = packaged_configs()
        for sub in folders:
            for cand in (root / sub / rel, root / sub / f"{rel}.yaml"):
                if cand.is_file():
                    return cand
    names = [f"{sub}/{n}" if sub else n for sub in folders for n in packaged_config_names(sub)]
    if p.is_dir():
        raise ConfigError(f"{ref}: a directory, and no packaged config has that name; name a YAML file (packaged: {', '.join(names)})")
    raise ConfigError(f"{ref}: file not found, and no packaged config has that name (packaged: {', '.join(names)})")


def read_yaml(path: str | Path) -> Any:
    p = find_config(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a text file (byte {exc.start} is not UTF-8); expected YAML") from None
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
