"""Run metadata for reproducibility: seed, workload spec, config hash, versions, hardware class.

The hardware fingerprint and the provenance record live in :mod:`deltatap.core.provenance` (one definition,
read by every command); this module adds the report-side helpers: the config hash, the demo's run metadata,
and Appendix C.1's fields from a run's provenance (:func:`c1_from_provenance`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from deltatap import __version__
from deltatap.core.provenance import canonical_json, hardware_fingerprint, provenance

__all__ = ["c1_from_provenance", "canonical_json", "config_hash", "hardware_fingerprint", "run_metadata", "software_line", "with_provenance"]


def config_hash(config: Any) -> str:
    """SHA-256 (hex, first 16 chars) of the canonical JSON of a config (dicts, pydantic models)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


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
    meta["provenance"] = provenance(tool="demo", seed=seed, hardware=meta["hardware"])
    meta.update(extra or {})
    return meta


def software_line(prov: dict[str, Any]) -> str | None:
    """Appendix C.1 "Software": the components' versions as they exposed them, then deltatap's."""
    parts = []
    for name, v in sorted((prov.get("components") or {}).items()):
        if isinstance(v, dict):
            bits = [str(v[k]) for k in ("version", "server") if v.get(k)]
            if v.get("models_owned_by"):
                bits.append(f"models owned by {v['models_owned_by']}")
            desc = ", ".join(bits) or "no version exposed"
            if v.get("url"):
                desc += f" at {v['url']}"
        else:
            desc = str(v)
        parts.append(f"{name}: {desc}")
    if prov.get("deltatap_version"):
        parts.append(f"deltatap {prov['deltatap_version']} ({prov.get('suite_version') or 'no suite'})")
    return "; ".join(parts) or None


def c1_from_provenance(prov: dict[str, Any]) -> dict[str, Any]:
    """Appendix C.1 fields a provenance record (:func:`deltatap.core.provenance.provenance`) knows."""
    out: dict[str, Any] = {}
    if not isinstance(prov, dict):
        return out
    if isinstance(prov.get("hardware"), dict) and prov["hardware"].get("accelerator_summary"):
        out["hardware"] = prov["hardware"]
    sw = software_line(prov)
    if sw:
        out["software"] = sw
    if prov.get("models"):
        out["model"] = ", ".join(map(str, prov["models"]))
    for k in ("seed", "suite_version", "workload_sha256", "topology_sha256"):
        if prov.get(k) is not None:
            out[k] = prov[k]
    return out


def with_provenance(meta: dict[str, Any], prov: dict[str, Any] | None) -> dict[str, Any]:
    """``meta`` with a ``provenance`` record and the C.1 fields it knows, where ``meta`` does not say better."""
    if not prov:
        return meta
    filled = c1_from_provenance(prov)
    out = {**meta, "provenance": meta.get("provenance") or prov}
    for k, v in filled.items():
        cur = out.get(k)
        weak = cur in (None, "", {}) or (isinstance(cur, str) and cur.startswith("not recorded")) or (
            isinstance(cur, dict) and str(cur.get("accelerator_summary", "")).startswith("not recorded"))
        if weak:
            out[k] = v
    return out
