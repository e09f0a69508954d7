"""LoadOptions: everything one ``deltatap load`` run needs (strict; the CLI and tests build it)."""

from __future__ import annotations

import hashlib
import json
import resource
from typing import Any, Literal

from pydantic import Field, model_validator

from deltatap.core.config import PROCESSES_PER_CPU, StrictModel, processes_allowed  # (--processes' bound: the tap's --workers' rule)
from deltatap.loadgen.arrivals import ARRIVALS
from deltatap.loadgen.client import ENDPOINTS, check_http_url


DEFAULT_MODEL = "default"  # the model sent when none is given and the target lists none at GET /v1/models
MAX_SECONDS = 30 * 86400.0  # the bound of every span of time a run takes (a timeout, --duration, the open loop's plan)
MAX_REQUESTS = 10_000_000  # the most requests one run plans (each is prepared before the first send)
FRAMING_HEADERS = ("content-length", "transfer-encoding")  # the load generator frames each body itself


def _connections_allowed() -> int:
    """The most connections one load process may hold at once: its open-file limit less room for everything else."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft - 64 if soft != resource.RLIM_INFINITY else 1 << 30


class LoadOptions(StrictModel):
    target: str = Field(description="base URL (the endpoint path is appended) or a full endpoint URL")
    endpoint: Literal["chat", "completions"] = Field(default="chat", description="OpenAI API: chat (/v1/chat/completions) or completions (/v1/completions)")
    model: str | None = Field(
        default=None,
        min_length=1,
        description=f"model name put in each request body; default: the first model the target lists at GET /v1/models, "
        f"else {DEFAULT_MODEL!r}",
    )
    workload: str | dict[str, Any] = Field(default="synthetic-uniform", description="name, YAML path, or a workload mapping")
    # exactly one load shape: rate (open loop), concurrency (closed loop) or batch (barrier batches)
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="open loop: mean requests per second")
    arrival: str = Field(default="poisson", description="open-loop arrival process: poisson, uniform or bursty")
    concurrency: int | None = Field(default=None, gt=0, description="closed loop: requests kept in flight")
    batch: int | None = Field(default=None, gt=0, description="barrier-synchronised batches of N requests sent at one instant")
    requests: int | None = Field(default=None, gt=0, le=MAX_REQUESTS, description="measured requests (default 100 without a duration)")
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description="stop sending after this many seconds")
    seed: int = Field(default=42, ge=0, description="seed of the request plan and the arrival times (same seed, same run)")
    warmup_requests: int = Field(default=0, ge=0, description="warm-up requests per round before measuring (0 = cold start)")
    warmup_probes: int = Field(default=5, ge=2, description="probe requests before and after each warm-up round (stability check)")
    warmup_rounds: int = Field(default=3, ge=1, description="most warm-up rounds before the run goes on unstable")
    warmup_concurrency: int | None = Field(default=None, gt=0, description="warm-up requests in flight (default: the run's concurrency or batch, else min(8, 2 x workers))")
    out: str | None = Field(default=None, description="output directory (records.jsonl, summary.json, run.json, requests.jsonl)")
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers on every request")
    labels: dict[str, str] = Field(default_factory=dict, description="labels put on every request")
    request_timeout_s: float = Field(default=600.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description="seconds one request may take, end of the answer included")
    drain_s: float = Field(default=30.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description="with a duration: how long in-flight requests may finish")
    workers: int = Field(default=4, gt=0, description="open loop: sessions (connection pools) requests rotate over")
    clock_sync: str | None = Field(default=None, description="collector base URL for the NTP-style offset estimate")
    refusal_statuses: list[int] = Field(default_factory=lambda: [403, 451], description="HTTP statuses counted as refusals, not errors")
    ignore_eos: bool = Field(default=False, description="ask the engine to generate exactly max_tokens")
    spin_us: int = Field(default=1500, ge=0, le=1_000_000, description="final part of each send wait spent yielding instead of on a timer")
    preconnect: bool | None = Field(
        default=None,
        description="open connections (handshakes only, no request) before timed sends; default: only for --batch",
    )
    progress: bool = Field(default=True, description="show live progress on stderr")
    gpu: bool = Field(default=True, description="sample NVIDIA GPU metrics (NVML) when a GPU is present")
    write_requests: bool = Field(default=True, description="write the request plan to requests.jsonl under out")
    coordinate: str | None = Field(default=None, description="several hosts: be the coordinator, listening at HOST:PORT (loadgen/coordinate.py)")
    hosts: int | None = Field(default=None, ge=2, description="with coordinate: how many hosts send load, this one included")
    coordinator: str | None = Field(default=None, description="several hosts: the coordinator's URL (http://HOST:PORT) to join")
    start_in_s: float = Field(default=2.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description="with coordinate: the shared start, this long after the last host joined")
    run_id: str | None = Field(default=None, description="run id in request ids and spans (default: 8 random hex digits)")
    processes: int = Field(default=1, ge=1, le=256, description="send from N processes: request i goes to process i mod N, "
                           "all from one shared start; the records are merged (open and closed loop, single-turn workloads)")

    @model_validator(mode="after")
    def _check(self) -> LoadOptions:
        shapes = [n for n, v in (("rate", self.rate), ("concurrency", self.concurrency), ("batch", self.batch)) if v is not None]
        if len(shapes) > 1:
            raise ValueError(f"choose one load shape: --rate (open loop), --concurrency (closed loop) or --batch; got {', '.join(shapes)}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival {self.arrival!r} unknown; choose one of {', '.join(sorted(ARRIVALS))}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint {self.endpoint!r} unknown; choose one of {', '.join(ENDPOINTS)}")
        if self.clock_sync:
            check_http_url(self.clock_sync, "--clock-sync")
        if self.coordinate and self.coordinator:
            raise ValueError("--coordinate (be the coordinator) and --coordinator URL (join one) exclude each other")
        if self.coordinate and self.hosts is None:
            raise ValueError("--coordinate needs --hosts N (how many hosts send load, this one included)")
        if self.hosts is not None and not self.coordinate:
            raise ValueError("--hosts is the coordinator's: give it with --coordinate HOST:PORT")
        if self.processes > processes_allowed():
            raise ValueError(f"--processes {self.processes}: at most {processes_allowed()} on this host ({PROCESSES_PER_CPU} per "
                             f"CPU it may use; one per core is the useful most: each is a whole Python process)")
        if self.processes > 1 and self.batch is not None:
            raise ValueError("--processes works with --rate or --concurrency: a --batch barrier cannot span processes")
        if self.processes > 1 and self.mode == "closed" and (self.concurrency or 1) < self.processes:  # (the default: 1)
            raise ValueError(f"--processes {self.processes} needs --concurrency >= {self.processes} (each process keeps its part in "
                             f"flight; without --rate or --concurrency the run is a closed loop of --concurrency 1)")
        for name, value in self.headers.items():
            if not name or any(c in name for c in " :\t\r\n\0") or any(c in value for c in "\r\n\0"):
                raise ValueError(f"header {name!r}: a name without spaces or colons and a value without line breaks")
            if name.lower() in FRAMING_HEADERS:
                raise ValueError(f"--header {name}: the load generator frames each request body itself (Content-Length); "
                                 f"leave it out")
        if self.run_id and not all(c.isalnum() or c in "_.-" for c in self.run_id):
            raise ValueError(f"--run-id {self.run_id!r}: letters, digits, '_', '.' and '-' only (it is put in request ids "
                             f"and headers)")
        for status in self.refusal_statuses:
            if not 400 <= status <= 599:
                raise ValueError(f"--refusal-status {status}: a refusal is an error status, 400 to 599 (default 403 and 451)")
        if self.rate is not None and self.planned_count() / self.rate > MAX_SECONDS:
            raise ValueError(f"--rate {self.rate:g} spreads the {self.planned_count()} planned requests over "
                             f"{self.planned_count() / self.rate:.3g} s, past the {MAX_SECONDS:g} s a run may take; raise --rate "
                             f"or plan fewer requests")
        if self.planned_count() > MAX_REQUESTS:
            raise ValueError(f"the run plans {self.planned_count()} requests (--rate x --duration); at most {MAX_REQUESTS} "
                             f"a run: split it, or give --requests")
        at_once = max(self.concurrency or 0, self.batch or 0, self.warmup_concurrency or 0, self.workers)
        most = _connections_allowed()
        if at_once > most:
            raise ValueError(f"{at_once} connections at once (--concurrency, --batch, --warmup-concurrency or --workers) are "
                             f"more than this process may open ({most}: ulimit -n less room for the rest); lower it, or "
                             f"raise ulimit -n")
        return self

    @property
    def mode(self) -> str:
        if self.rate is not None:
            return "open"
        if self.batch is not None:
            return "batch"
        return "closed"

    def planned_count(self, default_closed: int = 1000) -> int:
        """How many requests to plan: --requests, else enough for --duration (cycled if outlasted)."""
        if self.requests is not None:
            return self.requests
        if self.duration_s is None:
            return 100
        if self.rate is not None:
            return int(self.rate * self.duration_s * 1.2) + 10
        return default_closed

    def config_hash(self, workload_spec: dict[str, Any]) -> str:
        data = self.model_dump(mode="json", exclude={"out", "progress", "run_id", "headers"})
        data["headers"] = sorted(self.headers)  # names only: values may be secrets
        blob = json.dumps({"options": data, "workload": workload_spec}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
