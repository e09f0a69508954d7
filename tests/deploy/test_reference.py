"""docs/reference.md is generated from the parsers and the config models; it must equal the output."""

from __future__ import annotations

import argparse

from deltatap.app import refdoc
from deltatap.app.cli import build_parser


def test_committed_reference_equals_generated_output():
    committed = refdoc.REFERENCE_PATH.read_text(encoding="utf-8")
    assert committed == refdoc.render(), "docs/reference.md is stale: run `python -m deltatap.app.refdoc`"


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "reference.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert refdoc.main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert refdoc.main(["--output", str(stale)]) == 0
    assert refdoc.main(["--check", "--output", str(stale)]) == 0


def _all_flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _all_flags(child, (*path, name))
        elif action.option_strings and action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
            yield path, action.option_strings[-1]


def test_every_command_and_flag_is_in_the_reference():
    text = refdoc.render()
    parser = build_parser()
    for path, flag in _all_flags(parser):
        if path:
            assert f"`deltatap {' '.join(path)}`" in text, path
        assert f"`{flag}`" in text, (path, flag)


def test_every_config_key_is_in_the_reference():
    text = refdoc.render()
    models = refdoc.available_models()
    assert models, "no configuration model found"
    for _entry, model in models:
        found: dict = {}
        refdoc._collect_models(model, found)
        for m in found.values():
            assert f"#### {m.__name__}" in text
            for name, info in m.model_fields.items():
                assert f"| `{info.alias or name}` |" in text, (m.__name__, name)
