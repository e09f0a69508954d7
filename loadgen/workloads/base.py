"""Workload registry, the planned request, and loading workload specs from names or YAML.

A workload turns ``(params, n, seed)`` into a list of :class:`PlannedRequest`: the exact sequence the
run will send, fixed before the first request goes out. The sequence can be written to JSON lines and
replayed (workload ``replay``). Multi-turn workloads (chatbot) plan each session's user turns; the
assistant replies that enter the history are the server's real answers, added at run time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from deltatap.core.config import ConfigError, StrictModel, find_config, packaged_config_names, read_yaml, validate
from deltatap.loadgen.tokens import Tokenizer


@dataclass
class PlannedRequest:
    """One request of the plan. ``input_tokens`` counts system + prompt with the reference tokenizer
    (for later chatbot turns the history is added at run time and counted then)."""

    index: int
    prompt: str
    max_tokens: int
    input_tokens: int
    system: str | None = None
    session: int | None = None  # requests of one session run in order, one at a time; None: on its own
    turn: int = 0
    think_s: float = 0.0  # pause after the previous turn's end before this one is sent
    history_tokens: int = 0  # sliding-window size for the session's history (0: no history)
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlannedRequest:
        return cls(**d)


class WorkloadParams(StrictModel):
    """Base of every workload's parameter model (strict: unknown keys are errors)."""


Generator = Callable[[Any, int, np.random.Generator, Tokenizer], list[PlannedRequest]]


@dataclass(frozen=True)
class WorkloadType:
    name: str
    params: type[WorkloadParams]
    generate: Generator
    description: str


WORKLOADS: dict[str, WorkloadType] = {}


def register(name: str, params: type[WorkloadParams], description: str) -> Callable[[Generator], Generator]:
    def deco(fn: Generator) -> Generator:
        WORKLOADS[name] = WorkloadType(name, params, fn, description)
        return fn

    return deco


class WorkloadFile(StrictModel):
    """A workload YAML file: workload: NAME, its params, and labels put on every request."""

    workload: str
    description: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


@dataclass
class WorkloadSpec:
    name: str
    params: WorkloadParams
    labels: dict[str, str]
    source: str  # "name" or the YAML path

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.name, "params": self.params.model_dump(mode="json"), "labels": self.labels, "source": self.source}

    def generate(self, n: int, seed: int, tokenizer: Tokenizer) -> list[PlannedRequest]:
        wtype = WORKLOADS[self.name]
        rng = np.random.default_rng([seed, 0x3041])
        reqs = wtype.generate(self.params, n, rng, tokenizer)
        for r in reqs:
            r.labels = {"workload": self.name, **self.labels, **r.labels}
        return reqs


def _get_type(name: str, source: str) -> WorkloadType:
    _ensure_builtin()
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ConfigError(f"{source}: unknown workload {name!r}; choose one of: {', '.join(sorted(WORKLOADS))} or a YAML file") from None


def spec_from_mapping(data: Any, source: str) -> WorkloadSpec:
    wf = validate(WorkloadFile, data, source)
    wtype = _get_type(wf.workload, source)
    params = validate(wtype.params, wf.params, f"{source} [params]")
    return WorkloadSpec(wf.workload, params, dict(wf.labels), source)


def load_workload(ref: str) -> WorkloadSpec:
    """A workload from a registered name (defaults = Appendix A), a packaged workload file's name
    (``configs/workloads/NAME.yaml``) or a YAML file path."""
    _ensure_builtin()
    if ref in WORKLOADS:
        return WorkloadSpec(ref, WORKLOADS[ref].params(), {}, "name")
    if ref.endswith((".yaml", ".yml")) or Path(ref).exists():
        return spec_from_mapping(read_yaml(ref), ref)
    if ref in packaged_config_names("workloads"):
        path = find_config(ref, "workloads")
        return spec_from_mapping(read_yaml(path), str(path))
    raise ConfigError(f"--workload: {ref!r} is neither a workload name ({', '.join(sorted(WORKLOADS))}), "
                      f"nor a packaged workload file ({', '.join(packaged_config_names('workloads'))}), nor a YAML file")


def write_requests(path: str | Path, requests: list[PlannedRequest]) -> None:
    """Write the exact request sequence as JSON lines (replay it with workload ``replay``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as fh:
        for r in requests:
            fh.write(r.to_json() + "\n")


def read_requests(path: str | Path) -> list[PlannedRequest]:
    p = Path(path)
    out: list[PlannedRequest] = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read request sequence ({exc.strerror or exc})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(PlannedRequest.from_dict(json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{p}:{i}: not a request record written by 'deltatap load' ({exc})") from None
    return out


def _ensure_builtin() -> None:
    # the built-in workloads register themselves on import
    import deltatap.loadgen.workloads  # noqa: F401
