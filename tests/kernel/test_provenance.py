"""Provenance (deltatap.core.provenance): hashes, the version probe against a real server, 3-sigma flags."""

from __future__ import annotations

import asyncio

from aiohttp import web

from deltatap.core.provenance import SUITE_VERSION, flag_outliers, probe_versions, provenance, topology_sha256, workload_sha256
from deltatap.core.topology import default_topology


def test_workload_hash_is_over_the_bytes_in_order():
    a = workload_sha256(["ab", "c"])
    assert a == workload_sha256([b"ab", b"c"])
    assert a != workload_sha256(["a", "bc"]) and a != workload_sha256(["c", "ab"])


def test_topology_hash_changes_with_the_topology():
    t = default_topology()
    other = t.model_copy(update={"name": "other"})
    assert topology_sha256(t) == topology_sha256(default_topology()) != topology_sha256(other)


def test_record_fields():
    rec = provenance(tool="load", seed=3, workload_bytes_sha256="ab", topology=default_topology(), components={"engine": "1.2"})
    assert rec["suite_version"] == SUITE_VERSION and rec["seed"] == 3 and rec["components"] == {"engine": "1.2"}
    hw = rec["hardware"]
    assert hw["accelerator_summary"] and len(hw["fingerprint_hash"]) == 64 and hw["cpu"].endswith("cores")
    assert rec["tool"] == "deltatap load" and rec["software"]["deltatap"] == rec["deltatap_version"]


def test_outliers_beyond_three_sigma_are_flagged_per_cluster_never_dropped():
    values = [10.0, 10.2, 9.9, 10.1, 10.0, 30.0, 30.2, 29.8, 30.1, 45.0]
    clusters = ["a"] * 5 + ["b"] * 5
    flags = flag_outliers(values, clusters)
    assert len(flags) == len(values)
    assert flags == [False] * 9 + [True]
    assert flag_outliers([1.0, 100.0]) == [False, False]  # too few to say


def test_probe_versions_reads_server_header_version_and_models(tmp_path):
    async def scenario():
        async def version(_r):
            return web.json_response({"version": "b1234"}, headers={"Server": "llama.cpp"})

        async def models(_r):
            return web.json_response({"data": [{"id": "m1", "owned_by": "llamacpp"}]})

        app = web.Application()
        app.router.add_get("/version", version)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await asyncio.to_thread(probe_versions, f"http://127.0.0.1:{port}/v1/chat/completions", 2.0)
        finally:
            await runner.cleanup()

    got = asyncio.run(scenario())
    assert got == {"server": "llama.cpp", "version": "b1234", "models_owned_by": "llamacpp", "models": ["m1"]}
    assert probe_versions("http://127.0.0.1:9/", 0.5) == {}  # nothing listening: nothing claimed
