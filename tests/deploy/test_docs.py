"""The commands the deployment docs tell people to run are real: every `deltatap ...` line in a bash
block is parsed and validated like the compose commands, and every `docker compose ...` line names
profiles and services that docker-compose.yml has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from .commands import ROOT, check_command
from .compose import load_compose

DOCS = [ROOT / "docs" / "quickstart.md", ROOT / "docs" / "staging.md", ROOT / "README.md", ROOT / "docs" / "bench.md", ROOT / "docs" / "loadgen.md",
        ROOT / "docs" / "tap.md"]
PLACEHOLDERS = {"COLLECTOR": "127.0.0.1", "JAEGER": "127.0.0.1", "DOCKER_HOST": "127.0.0.1"}
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def _commands(path: Path) -> list[list[str]]:
    out = []
    for block in _BLOCK.findall(path.read_text(encoding="utf-8")):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            for k, v in PLACEHOLDERS.items():
                line = line.replace(k, v)
            words: list[str] = []
            for w in shlex.split(line):
                if w in ("&&", "||", ";", "|"):
                    out.append(words)
                    words = []
                else:
                    words.append(w)
            out.append(words)
    return out


def _deltatap_commands() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for words in _commands(doc):
            if words and words[0].endswith("deltatap") and len(words) > 1:
                found.append((doc.name, words[1:]))
    return found


def test_documented_commands_run_after_the_readme_install():
    """The README installs into .venv without activating it: a bare `deltatap` is not on PATH there."""
    bare = [(doc.name, " ".join(words[:3])) for doc in DOCS for words in _commands(doc)
            if words and words[0].endswith("deltatap") and words[0] != ".venv/bin/deltatap"]
    assert not bare, bare


def _compose_commands() -> list[tuple[str, list[str]]]:
    return [(doc.name, w[2:]) for doc in DOCS for w in _commands(doc) if w[:2] == ["docker", "compose"]]


def test_the_docs_show_commands():
    names = {cmd[0] for _doc, cmd in _deltatap_commands()}
    assert {"tap", "collect", "load", "stack", "demo", "summary"} <= names
    assert _compose_commands()


@pytest.mark.parametrize("doc,cmd", _deltatap_commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x[:2]))
def test_documented_deltatap_command_is_valid(doc: str, cmd: list[str]):
    check_command(cmd)


def test_documented_docker_compose_commands_name_real_profiles_and_services():
    compose = load_compose({})
    services = set(compose.services)
    profiles = {p for s in compose.services.values() for p in s.get("profiles", [])}
    for doc, words in _compose_commands():
        for i, w in enumerate(words):
            if w == "--profile":
                assert words[i + 1] in profiles, f"{doc}: profile {words[i + 1]} not in docker-compose.yml"
            if w == "--scale":
                assert words[i + 1].split("=")[0] in services, f"{doc}: {words[i + 1]}"
        sub = words[0]
        args = [w for j, w in enumerate(words[1:], 1) if not w.startswith("-") and words[j - 1] not in ("--profile", "--scale")]
        if sub in ("stop", "start"):
            assert set(args) <= services, f"{doc}: {words}"
        if sub in ("up",) and args:
            assert set(args) <= services, f"{doc}: {words}"
        if sub == "run":
            i = next(j for j, w in enumerate(words[1:], 1) if not w.startswith("-"))
            assert words[i] in services, f"{doc}: {words}"
            check_command(words[i + 1 :])  # `run [--rm] SERVICE CMD...` runs `deltatap CMD...` in the image
        if sub == "cp":
            assert args[0].split(":")[0] in services, f"{doc}: {words}"
