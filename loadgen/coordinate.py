"""Load from several hosts with one shared start instant (``deltatap load --coordinate`` / ``--coordinator``).

One ``deltatap load`` is the coordinator (``--coordinate HOST:PORT --hosts N``): it serves

* ``GET /v1/clock`` - the NTP-style exchange of :mod:`deltatap.core.clocksync`, so every other host
  estimates its clock offset to the coordinator (lowest-delay samples), and
* ``POST /v1/join`` - a host joins with the key of its plan; when all ``N`` hosts (the coordinator
  included) have joined, each is answered with its index and the start instant, ``--start-in`` seconds
  (default 2) after the last join, on the coordinator's clock.

The others run the same command with ``--coordinator http://HOST:PORT`` instead. Every host builds the
same plan (same workload, seed, request count, rate, arrival process: the join refuses a host whose plan
differs) and sends its share of it: host ``i`` of ``N`` takes units ``i, i+N, i+2N, ...`` with their
planned offsets, so in open loop the hosts together send exactly the single-host schedule; in closed loop
and batch mode each host keeps its own ``--concurrency`` / ``--batch`` going on its share. Each host turns
the start instant into its own clock with its offset estimate, and its records carry its planned and
actual send times (``planned_send_unix_ns``, ``schedule_lag_ns``) as usual; ``deltatap report --from``
takes all the hosts' output directories together.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from deltatap.core.clock import mono_ns, now_unix_ns
from deltatap.core.clocksync import CLOCK_PATH, clock_answer, estimate_offset
from deltatap.core.config import ConfigError
from deltatap.core.topology import parse_hostport

JOIN_PATH = "/v1/join"


@dataclass(frozen=True)
class Assignment:
    """This host's share: index ``index`` of ``hosts``, starting at ``start_unix_ns`` (coordinator clock)."""

    index: int
    hosts: int
    start_unix_ns: int
    offset_ns: int = 0  # this host's clock minus the coordinator's
    uncertainty_ns: int = 0

    def start_mono_ns(self) -> int:
        """The shared start on this host's monotonic clock."""
        local_unix = self.start_unix_ns + self.offset_ns
        return mono_ns() + (local_unix - now_unix_ns())

    def share(self, items: list) -> list:
        return items[self.index :: self.hosts]

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "hosts": self.hosts, "start_unix_ns": self.start_unix_ns,
                "clock_offset_ns": self.offset_ns, "clock_uncertainty_ns": self.uncertainty_ns}


def plan_key(fields: dict[str, Any]) -> str:
    """A short hash of what makes the plan: hosts with different keys would not split one schedule."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Coordinator:
    def __init__(self, hosts: int, key: str, start_in_s: float = 2.0, join_timeout_s: float = 120.0) -> None:
        if hosts < 2:
            raise ConfigError("--hosts must be >= 2 with --coordinate (the coordinator is one of them)")
        if start_in_s <= 0:
            raise ConfigError("--start-in must be > 0")
        self.hosts, self.key, self.start_in_s, self.join_timeout_s = hosts, key, start_in_s, join_timeout_s
        self.joined: list[str] = []  # host names, the coordinator first
        self._all = asyncio.Event()
        self._start_unix_ns: int | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def _admit(self, name: str) -> int:
        index = len(self.joined)
        self.joined.append(name)
        if len(self.joined) == self.hosts:
            self._start_unix_ns = now_unix_ns() + int(self.start_in_s * 1e9)
            self._all.set()
        return index

    async def _clock(self, request: web.Request) -> web.Response:
        received = now_unix_ns()
        return web.Response(body=clock_answer(received), content_type="application/json")

    async def _join(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "the body must be JSON: {\"plan\": KEY, \"host\": NAME}"}, status=400)
        if body.get("plan") != self.key:
            return web.json_response({"error": f"this host's plan ({body.get('plan')}) is not the coordinator's ({self.key}): "
                                      "run every host with the same --workload, --seed, --requests/--duration and load shape"}, status=409)
        if self._all.is_set():
            return web.json_response({"error": f"all {self.hosts} hosts have joined already"}, status=409)
        index = self._admit(str(body.get("host") or request.remote))
        await self._all.wait()
        return web.json_response({"index": index, "hosts": self.hosts, "start_unix_ns": self._start_unix_ns})

    async def start(self, listen: str) -> None:
        try:
            host, port = parse_hostport(listen, "--coordinate")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        app = web.Application()
        app.router.add_get(CLOCK_PATH, self._clock)
        app.router.add_post(JOIN_PATH, self._join)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(f"--coordinate {host}:{port}: cannot listen ({exc.strerror or exc})") from None
        self.url = f"http://{host}:{site._server.sockets[0].getsockname()[1]}"

    async def assign_self(self) -> Assignment:
        """The coordinator's own share (index 0), once every other host has joined."""
        self._admit(socket.gethostname())
        try:
            await asyncio.wait_for(self._all.wait(), self.join_timeout_s)
        except asyncio.TimeoutError:
            raise ConfigError(f"--coordinate: only {len(self.joined)} of --hosts {self.hosts} hosts joined within "
                              f"{self.join_timeout_s:.0f} s; start the others with --coordinator {self.url}") from None
        assert self._start_unix_ns is not None
        return Assignment(0, self.hosts, self._start_unix_ns)

    async def close(self, linger_s: float = 0.0) -> None:
        if self._runner is not None:
            await asyncio.sleep(linger_s)
            await self._runner.cleanup()
            self._runner = None


async def join(url: str, key: str, timeout_s: float = 120.0) -> Assignment:
    """Join the coordinator at ``url``: estimate this host's clock offset to it, then wait for the start."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--coordinator {url!r}: use http://HOST:PORT (the coordinator's --coordinate address)")
    try:
        clock = await estimate_offset(url)
    except ConnectionError as exc:
        raise ConfigError(f"--coordinator {url}: {exc}") from None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.post(url + JOIN_PATH, json={"plan": key, "host": socket.gethostname()}) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise ConfigError(f"--coordinator {url}: {body.get('error') if isinstance(body, dict) else body}")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        raise ConfigError(f"--coordinator {url}: no start instant within {timeout_s:.0f} s ({exc or type(exc).__name__})") from None
    return Assignment(int(body["index"]), int(body["hosts"]), int(body["start_unix_ns"]), clock.offset_ns, clock.uncertainty_ns)
