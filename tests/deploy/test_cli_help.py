"""Every `deltatap ... --help` a user can read: each option has a help text, and no reStructuredText markup
or article slips leak into what argparse prints."""

from __future__ import annotations

import argparse
import re

import pytest

from deltatap.app.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = list(_parsers(build_parser()))


@pytest.mark.parametrize("path,parser", PARSERS, ids=[" ".join(p) or "deltatap" for p, _ in PARSERS])
def test_help_is_plain_and_complete(path, parser):
    text = parser.format_help()
    assert "``" not in text, f"deltatap {' '.join(path)} --help shows RST markup"
    assert not re.search(r"\ba [aeiou]\w* (file|section)", text), f"deltatap {' '.join(path)} --help: 'a' before a vowel"
    missing = [a.option_strings[0] for a in parser._actions
               if a.option_strings and a.help in (None, "") and not isinstance(a, argparse._HelpAction)]
    assert not missing, f"deltatap {' '.join(path)}: options without help: {missing}"
