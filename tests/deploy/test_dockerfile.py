"""The Dockerfile without Docker: what it copies exists and is not excluded by .dockerignore, the packages
it copies are exactly the ones pyproject.toml installs, it runs as a non-root user with the `deltatap`
entry point, and the configs compose refers to are inside the image."""

from __future__ import annotations

import ast
import fnmatch
import re

from .commands import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _ignored(path: str) -> bool:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.replace("**/", "")) or path.startswith(pat + "/"):
            ignored = not neg
    return ignored


def test_copied_sources_exist_and_are_in_the_build_context():
    copies = [rest for word, rest in _instructions() if word == "COPY" and "--from=" not in rest]
    assert copies
    for rest in copies:
        srcs = [w for w in rest.split() if not w.startswith("--")][:-1]
        for src in srcs:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert not _ignored(src), f"COPY {src}: excluded by .dockerignore"


def _installed_folders() -> set[str]:
    """The folders setup.py installs: ``deltatap`` and each folder of its ``FOLDERS`` mapping."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FOLDERS" for t in node.targets):
            return {"deltatap", *ast.literal_eval(node.value).values()}
    raise AssertionError("setup.py has no FOLDERS mapping")


def test_the_image_holds_every_installed_package():
    folders = _installed_folders()
    copied = {w.rstrip("/") for word, rest in _instructions() if word == "COPY" for w in rest.split()[:1]}
    assert folders <= copied, f"setup.py installs {sorted(folders)}, the Dockerfile copies {sorted(copied)}"
    for name in ("README.md", "pyproject.toml", "setup.py"):  # setuptools reads all three
        assert name in DOCKERFILE, name


def test_runs_unprivileged_with_the_deltatap_entry_point():
    ins = _instructions()
    users = [rest for word, rest in ins if word == "USER"]
    assert users and not users[-1].startswith(("root", "0")), users
    entry = [rest for word, rest in ins if word == "ENTRYPOINT"]
    assert entry == ['["deltatap"]']
    assert any(word == "FROM" and "slim" in rest for word, rest in ins)
    assert "configs /opt/deltatap/configs" in DOCKERFILE
    assert any(word == "WORKDIR" and rest == "/opt/deltatap" for word, rest in ins)


def test_the_working_directory_matches_the_compose_paths():
    """Compose passes configs/... and out/... relative to WORKDIR, and mounts its volume at /opt/deltatap/out."""
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "deltatap-out:/opt/deltatap/out" in compose
    assert "mkdir -p /opt/deltatap/out && chown deltatap:deltatap /opt/deltatap/out" in DOCKERFILE
