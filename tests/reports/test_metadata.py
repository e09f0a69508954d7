"""Run metadata: a coarse, stable hardware class (no host identity) and a deterministic config hash."""

from __future__ import annotations

import json
import socket

from deltatap.collector.reports.metadata import config_hash, hardware_fingerprint, run_metadata


def test_fingerprint_is_coarse_and_stable():
    a, b = hardware_fingerprint(gpus=[]), hardware_fingerprint(gpus=[])
    assert a == b and len(a["fingerprint_hash"]) == 64
    assert set(a) == {"os", "cpu", "ram_gb", "gpu", "backend_versions", "accelerator_summary", "fingerprint_hash"}
    assert a["ram_gb"] is None or a["ram_gb"] % 8 == 0
    assert a["gpu"] == "none" and a["accelerator_summary"].startswith("CPU only")
    text = json.dumps(a)
    assert socket.gethostname() not in text  # a class, not a device


def test_gpu_names_are_counted_not_identified():
    fp = hardware_fingerprint(gpus=["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    assert fp["gpu"] == "NVIDIA H100 80GB HBM3 x 2"
    assert fp["fingerprint_hash"] != hardware_fingerprint(gpus=[])["fingerprint_hash"]


def test_config_hash_ignores_key_order_and_run_metadata_is_json():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    meta = run_metadata(seed=7, workload={"workload": "firewall"}, config={"x": 1}, hardware={"class": "test"})
    assert meta["seed"] == 7 and meta["config_hash"] == config_hash({"x": 1}) and meta["hardware"] == {"class": "test"}
    json.dumps(meta)
