"""Provenance of a run: what a reader needs to trust a number and to reproduce it.

One record, written by every ``deltatap load``, ``collect`` and ``report`` run (and by ``bench``:
call :func:`provenance`), and read by the reports' Appendix C.1 (``collector/reports/metadata.py``):

* ``seed``: the load generator's seed (None where the run has none, e.g. a collector);
* ``workload_sha256``: SHA-256 of the workload *bytes*: the planned request bodies the load generator sent
  (prompt, system prompt, max_tokens, session and turn, in plan order), so two runs that sent the same bytes
  share it whatever file or flags produced them;
* ``topology_sha256``: SHA-256 of the topology's canonical JSON (components, links, taps, timeouts);
* ``suite_version``: versioned suite id as llm-speed's ``suite-v1``: :data:`SUITE_VERSION` names the set of
  definitions a deltatap result rests on (points t0-t12, the deltas, the metric definitions, the packaged
  workloads). It changes when any of them changes meaning; old results stay valid, and distinguishable;
* ``deltatap_version`` and ``software`` (Python, numpy, aiohttp);
* ``components``: component name -> version where the component exposes one: its spans' resource attributes
  (``service.name`` / ``service.version``), its HTTP ``Server`` header, ``GET /version`` or ``GET /v1/models``
  (:func:`probe_versions`);
* ``hardware``: the coarse hardware class of this machine (:func:`hardware_fingerprint`, llm-speed's rules: class,
  never a device identity; no host name, user name, MAC, serial or PCI bus id is read).

:func:`flag_outliers` flags repeated runs beyond 3 sigma of their cluster (llm-speed: flagged, never dropped).
This module is kernel: it imports only the standard library, numpy-free, and ``deltatap.core``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from deltatap import __version__

SUITE_VERSION = "suite-v1"
RAM_BUCKET_GB = 8
OUTLIER_SIGMA = 3.0
PROBE_TIMEOUT_S = 2.0

__all__ = [
    "OUTLIER_SIGMA", "SUITE_VERSION", "canonical_json", "flag_outliers", "hardware_fingerprint", "probe_versions",
    "provenance", "sha256_hex", "topology_sha256", "versions_from_span_attrs", "workload_sha256",
]


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces: the form every hash here is taken over (signing uses RFC 8785: ``signing.jcs``)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def workload_sha256(bodies: Iterable[bytes | str]) -> str:
    """SHA-256 over the request bodies in order, each length-prefixed (so no two splits of the bytes collide)."""
    h = hashlib.sha256()
    for b in bodies:
        raw = b.encode("utf-8") if isinstance(b, str) else bytes(b)
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return h.hexdigest()


def topology_sha256(topology: Any) -> str | None:
    if topology is None:
        return None
    data = topology.model_dump(mode="json") if hasattr(topology, "model_dump") else topology
    return sha256_hex(canonical_json(data))


# ---- hardware class -------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _ram_gb_bucket() -> int | None:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    gb = total / 2**30
    return max(RAM_BUCKET_GB, int(round(gb / RAM_BUCKET_GB)) * RAM_BUCKET_GB)


def _gpus() -> list[str]:
    """Accelerator model names only (NVML), or [] when there is none or NVML is absent."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pynvml's deprecation notice
            import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def software_versions() -> dict[str, str]:
    out = {"deltatap": __version__, "python": ".".join(map(str, sys.version_info[:2]))}
    for mod in ("numpy", "aiohttp"):
        m = sys.modules.get(mod)
        if m is None:
            try:
                m = __import__(mod)
            except ImportError:  # pragma: no cover - hard dependencies
                continue
        out[mod] = str(getattr(m, "__version__", "?"))
    return out


def _gpu_summary(names: Sequence[str]) -> str:
    if not names:
        return "none"
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} x {c}" for n, c in counts.items())


_HW_CACHE: dict[str, Any] | None = None


def hardware_fingerprint(gpus: Sequence[str] | None = None) -> dict[str, Any]:
    """The coarse hardware class of this machine plus ``fingerprint_hash``, a SHA-256 over the bucketed fields
    only (OS name and major version, CPU model and core count, RAM in 8 GB buckets, accelerator names and
    count, backend versions), so two machines of one class share it."""
    global _HW_CACHE
    if gpus is None and _HW_CACHE is not None:
        return dict(_HW_CACHE)
    system = platform.system() or "unknown OS"
    release = platform.release().split(".")[0] if platform.release() else ""
    gpu_names = _gpus() if gpus is None else list(gpus)
    ram = _ram_gb_bucket()
    cores = os.cpu_count() or 0
    fields: dict[str, Any] = {
        "os": f"{system} {release}".strip(),
        "cpu": f"{_cpu_model()}, {cores} cores",
        "ram_gb": ram,
        "gpu": _gpu_summary(gpu_names),
        "backend_versions": software_versions(),
    }
    accel = fields["gpu"] if gpu_names else f"CPU only ({cores} cores)"
    fields["accelerator_summary"] = f"{accel} + {ram} GB RAM" if ram else accel
    fields["fingerprint_hash"] = sha256_hex(canonical_json(fields))
    if gpus is None:
        _HW_CACHE = dict(fields)
    return fields


# ---- component versions ---------------------------------------------------------------------------


def versions_from_span_attrs(attrs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """service.name -> service.version from spans' (resource) attributes; a component's name is its
    ``deltatap.component`` attribute where it sets one."""
    out: dict[str, str] = {}
    for a in attrs:
        version = a.get("service.version")
        if not version:
            continue
        name = a.get("deltatap.component") or a.get("service.name")
        if name and str(name) not in out:
            out[str(name)] = str(version)
    return out


def _get(url: str, timeout_s: float) -> tuple[int, dict[str, str], bytes] | None:
    req = urllib.request.Request(url, headers={"User-Agent": f"deltatap/{__version__} provenance"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - a URL the user gave
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read(65536)
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in (e.headers or {}).items()}, b""
    except (OSError, ValueError):
        return None


def probe_versions(base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """What an HTTP endpoint says about its software, bounded (two GETs, ``timeout_s`` each): the ``Server``
    header, ``GET /version`` (llama.cpp, vLLM, Ollama ``/api/version`` style JSON) and the ``owned_by`` of
    ``GET /v1/models``. Only what it answered is in the result; {} when it answered nothing."""
    base = base_url.rstrip("/") + "/"
    if "/v1/" in base:  # a base URL or an OpenAI-style endpoint URL under a prefix: the part before /v1/
        base = base.split("/v1/", 1)[0]
    else:  # else the origin
        scheme, _, rest = base.partition("://")
        base = f"{scheme}://{rest.split('/', 1)[0]}"
    out: dict[str, Any] = {}
    got = _get(base + "/version", timeout_s)
    if got is not None:
        status, headers, body = got
        if headers.get("server"):
            out["server"] = headers["server"]
        if status == 200:
            try:
                doc = json.loads(body)
                v = doc.get("version") or doc.get("build_info") if isinstance(doc, dict) else None
                if v:
                    out["version"] = str(v)
            except ValueError:
                text = body.decode("utf-8", "replace").strip()
                if text and len(text) < 100 and "\n" not in text:
                    out["version"] = text
    got = _get(base + "/v1/models", timeout_s)
    if got is not None:
        status, headers, body = got
        if headers.get("server") and "server" not in out:
            out["server"] = headers["server"]
        if status == 200:
            try:
                data = json.loads(body).get("data") or []
                owners = sorted({str(m["owned_by"]) for m in data if isinstance(m, dict) and m.get("owned_by")})
                ids = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]
                if owners:
                    out["models_owned_by"] = ", ".join(owners)
                if ids:
                    out["models"] = ids[:8]
            except (ValueError, AttributeError, TypeError):
                pass
    return out


# ---- the record -----------------------------------------------------------------------------------


def provenance(
    *,
    tool: str,
    seed: int | None = None,
    workload_bytes_sha256: str | None = None,
    topology: Any = None,
    suite_version: str = SUITE_VERSION,
    components: Mapping[str, Any] | None = None,
    hardware: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record of one run of ``tool`` (``load``, ``collect``, ``report``, ``bench``...), JSON-ready."""
    rec: dict[str, Any] = {
        "tool": f"deltatap {tool}",
        "deltatap_version": __version__,
        "suite_version": suite_version,
        "seed": seed,
        "workload_sha256": workload_bytes_sha256,
        "topology_sha256": topology_sha256(topology),
        "components": dict(components or {}),
        "software": software_versions(),
        "hardware": dict(hardware) if hardware is not None else hardware_fingerprint(),
    }
    rec.update(extra or {})
    return rec


def flag_outliers(values: Sequence[float], clusters: Sequence[Any] | None = None, sigma: float = OUTLIER_SIGMA) -> list[bool]:
    """Per value, True where it lies more than ``sigma`` standard deviations from the mean of the *other*
    members of its cluster (leave-one-out, so one wild run cannot hide itself by inflating the spread).
    Clusters of fewer than 3 runs flag nothing. Values are flagged, never dropped: the caller keeps them all."""
    keys = list(clusters) if clusters is not None else [None] * len(values)
    if len(keys) != len(values):
        raise ValueError("flag_outliers: one cluster key per value")
    flags = [False] * len(values)
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    for idx in groups.values():
        if len(idx) < 3:
            continue
        for i in idx:
            others = [float(values[j]) for j in idx if j != i and math.isfinite(float(values[j]))]
            if len(others) < 2 or not math.isfinite(float(values[i])):
                continue
            m = sum(others) / len(others)
            sd = math.sqrt(sum((x - m) ** 2 for x in others) / (len(others) - 1))
            if sd == 0.0:
                flags[i] = float(values[i]) != m
            else:
                flags[i] = abs(float(values[i]) - m) > sigma * sd
    return flags
