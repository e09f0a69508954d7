"""Run metadata for reproducibility: seed, workload spec, config hash, versions, hardware class.

The hardware fingerprint follows llm-speed's rule: coarse class, never a device identity. It
records the OS name and major version, the CPU model and core count, RAM rounded to an 8 GB
bucket, accelerator model names and count (no driver build, PCI bus id, UUID or serial), and
backend versions; ``fingerprint_hash`` is a SHA-256 over those bucketed fields only, so two
machines of the same class share it. No host name, user name or MAC address is ever read.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

from deltatap import __version__

RAM_BUCKET_GB = 8


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(config: Any) -> str:
    """SHA-256 (hex, first 16 chars) of the canonical JSON of a config (dicts, pydantic models)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


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


def _versions() -> dict[str, str]:
    import numpy

    out = {"deltatap": __version__, "python": ".".join(map(str, sys.version_info[:2])), "numpy": numpy.__version__}
    try:
        import aiohttp

        out["aiohttp"] = aiohttp.__version__
    except ImportError:  # pragma: no cover - a hard dependency
        pass
    return out


def hardware_fingerprint(gpus: list[str] | None = None) -> dict[str, Any]:
    """The coarse hardware class of this machine plus its hash (see the module docstring)."""
    system = platform.system() or "unknown"
    release = platform.release().split(".")[0] if platform.release() else ""
    gpu_names = _gpus() if gpus is None else gpus
    ram = _ram_gb_bucket()
    cores = os.cpu_count() or 0
    fields: dict[str, Any] = {
        "os": f"{system} {release}".strip(),
        "cpu": f"{_cpu_model()}, {cores} cores",
        "ram_gb": ram,
        "gpu": _gpu_summary(gpu_names),
        "backend_versions": _versions(),
    }
    accel = fields["gpu"] if gpu_names else f"CPU only ({cores} cores)"
    fields["accelerator_summary"] = f"{accel} + {ram} GB RAM" if ram else accel
    fields["fingerprint_hash"] = hashlib.sha256(canonical_json(fields).encode()).hexdigest()
    return fields


def _gpu_summary(names: list[str]) -> str:
    if not names:
        return "none"
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} x {c}" for n, c in counts.items())


def run_metadata(
    *,
    seed: int | None = None,
    workload: Any = None,
    config: Any = None,
    boundary: str = "compound (client -> gateway -> firewall -> engine)",
    extra: dict[str, Any] | None = None,
    hardware: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a reader needs to reproduce the run, as a JSON-ready dict."""
    meta: dict[str, Any] = {
        "deltatap_version": __version__,
        "seed": seed,
        "workload": workload.model_dump(mode="json") if hasattr(workload, "model_dump") else workload,
        "config_hash": config_hash(config) if config is not None else None,
        "sut_boundary": boundary,
        "hardware": hardware if hardware is not None else hardware_fingerprint(),
    }
    meta.update(extra or {})
    return meta
