"""Reading docker-compose.yml the way `docker compose` does, for tests that cannot run Docker.

Implements the parts of the Compose specification the file uses: variable interpolation
(``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``,
``$$`` for a literal ``$``), ``.env`` files of ``KEY=VALUE`` lines, YAML anchors/merge keys (PyYAML),
and profiles (a service with no ``profiles`` always runs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|(?P<plain>[A-Za-z_][A-Za-z0-9_]*)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})"
)


class InterpolationError(ValueError):
    pass


def variables_used(text: str) -> set[str]:
    return {m.group("plain") or m.group("name") for m in _VAR.finditer(text) if not m.group("escaped")}


def interpolate(value: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("plain") or m.group("name")
        op, arg = m.group("op"), m.group("arg") or ""
        present = name in env
        nonempty = present and env[name] != ""
        if op == ":-":
            return env[name] if nonempty else interpolate(arg, env)
        if op == "-":
            return env[name] if present else interpolate(arg, env)
        if op == ":?":
            if not nonempty:
                raise InterpolationError(f"{name}: {arg or 'required'}")
            return env[name]
        if op == "?":
            if not present:
                raise InterpolationError(f"{name}: {arg or 'required'}")
            return env[name]
        return env.get(name, "")

    return _VAR.sub(sub, value)


def _walk(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(x, env) for x in node]
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    return node


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        env[key.strip()] = value.strip().strip("'\"")
    return env


def env_example_keys(path: Path = ENV_EXAMPLE) -> set[str]:
    """Every variable .env.example documents, set or commented out (``# KEY=value``)."""
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#?\s*([A-Z][A-Z0-9_]*)=", line.strip())
        if m:
            keys.add(m.group(1))
    return keys


@dataclass
class Compose:
    raw: dict
    services: dict[str, dict]

    def active(self, profiles: set[str]) -> dict[str, dict]:
        return {n: s for n, s in self.services.items() if not s.get("profiles") or set(s["profiles"]) & profiles}


def load_compose(env: dict[str, str], path: Path = COMPOSE_FILE) -> Compose:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    # extension fields (x-*) are templates only; merge keys were resolved by the YAML loader
    data = _walk({k: v for k, v in raw.items() if not str(k).startswith("x-")}, env)
    return Compose(raw=data, services=data["services"])


def command_list(service: dict) -> list[str]:
    cmd = service.get("command")
    if cmd is None:
        return []
    if isinstance(cmd, str):
        import shlex

        return shlex.split(cmd)
    return [str(c) for c in cmd]


def port_mappings(service: dict) -> list[tuple[int | None, int]]:
    """(host port or None, container port) for every ``ports`` entry."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append((int(p["published"]) if p.get("published") else None, int(p["target"])))
            continue
        spec = str(p).split("/")[0]
        parts = spec.split(":")
        if len(parts) == 1:
            out.append((None, int(parts[0])))
        else:
            out.append((int(parts[-2]), int(parts[-1])))
    return out
