"""The wheel as a user gets it: built from a copy of the tracked files (plus the gitignored output a demo run
leaves behind), installed into a fresh venv outside the checkout, then run from an empty directory.

The fresh venv takes deltatap from the wheel only; its third-party dependencies come from the test venv's
site-packages (a path line in a .pth file, which adds the folder but does not run its editable-install hook),
so the test needs no package registry."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from .commands import ROOT

pytestmark = pytest.mark.timeout(600)


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to know the tracked files")
    src = tmp_path_factory.mktemp("src")
    for rel in _tracked_files():
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    # what a checkout where the demo ran holds: it must not ship
    (src / "deltatap-demo").mkdir()
    (src / "deltatap-demo" / "report.json").write_text("{}")
    (src / "out" / "load").mkdir(parents=True)
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = dist.glob("deltatap-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the wheel's files, unpacked as pip would (purelib), and its console script
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    (site / "deps-from-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = env_dir / "bin" / "deltatap"
    script.write_text(f"#!{py}\nimport sys\nfrom deltatap.app.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return env_dir


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def test_the_wheel_holds_only_the_deltatap_namespace(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"deltatap", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, sorted(top)
    for sub in ("proxy", "loadgen", "collector", "stack", "configs", "core", "net", "telemetry", "app"):
        assert f"deltatap/{sub}/__init__.py" in names, sub
    # the configs ship, found by name: topologies, the demo, workloads, example components
    for rel in ("configs/demo.yaml", "configs/workloads/chatbot.yaml", "configs/examples/vllm-litellm.yaml",
                "configs/examples/components/llamacpp-nginx/nginx.conf", "loadgen/data/sharegpt_sample.json"):
        assert f"deltatap/{rel}" in names, rel
    assert not any("deltatap-demo" in n or n.startswith("out/") for n in names)


def test_import_of_the_old_top_level_names_fails_in_the_installed_venv(installed, tmp_path):
    py = installed / "bin" / "python"
    code = ("import importlib.util as u, deltatap.proxy, deltatap.configs; "
            "print([n for n in ('proxy', 'collector', 'loadgen', 'stack', 'configs') if u.find_spec(n)]); "
            "print(deltatap.proxy.__file__)")
    proc = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    found, where = proc.stdout.splitlines()
    assert found == "[]"
    assert where.startswith(str(installed)), where  # not the checkout


def test_demo_runs_from_an_empty_directory(installed, tmp_path, tmp_path_factory):
    """The demo from the wheel: the packaged stack, workload, tokenizer, collector and report writers. Its load is
    cut to a short firewall mix (no cascade phase, which mostly waits out the engine's timeout): the full demo runs
    in tests/integration/test_demo.py; the packaged config found by name, in test_stack_all_by_packaged_name."""
    import yaml

    from deltatap.app.demo import DEFAULT_CONFIG
    from deltatap.core.config import find_config

    cfg = yaml.safe_load(find_config(DEFAULT_CONFIG).read_text(encoding="utf-8"))
    cfg["load"] = {"mix": {**cfg["load"]["mix"], "requests": 12}}
    small = tmp_path_factory.mktemp("cfg") / "demo-small.yaml"  # (not in the empty directory the demo runs in)
    small.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    proc = subprocess.run([str(installed / "bin" / "deltatap"), "demo", "--config", str(small), "--formats", "json,markdown"], cwd=tmp_path,
                          env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    out = tmp_path / "deltatap-demo"
    assert (out / "report.json").is_file() and (out / "records.jsonl").is_file()
    assert "decomposition rows" in proc.stdout


def test_stack_all_by_packaged_name_from_an_empty_directory(installed, tmp_path):
    proc = subprocess.Popen([str(installed / "bin" / "deltatap"), "stack", "all", "--config", "demo", "--taps", "--ephemeral", "--otlp", "none"],
                            cwd=tmp_path, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("send requests to"):
                break
        text = "".join(lines)
        m = re.search(r"send requests to (http://\S+)/v1/chat/completions \(model: ([\w.-]+)", text)
        assert m, text + (proc.stderr.read() if proc.poll() is not None else "")
        assert re.search(r"deltatap tap edge: http://127\.0\.0\.1:\d+\s+admin http://127\.0\.0\.1:\d+", text), text
        body = ('{"model": "%s", "stream": true, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}' % m.group(2)).encode()
        req = urllib.request.Request(m.group(1) + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
            assert b"data: [DONE]" in resp.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in proc.stderr.read()
