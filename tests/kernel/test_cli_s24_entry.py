"""The console script's entry (deltatap.app.main): a Ctrl-C before the command runs (while the command line is being
imported or built) ends with status 130 and no traceback, as one during a command does."""

from __future__ import annotations

import subprocess
import sys

import deltatap.app
import deltatap.app.cli as cli


def test_ctrl_c_while_the_command_line_is_built_is_130(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert deltatap.app.main() == 130
    assert "Traceback" not in capsys.readouterr().err


def test_python_m_deltatap_is_the_console_script():
    out = subprocess.run([sys.executable, "-m", "deltatap", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("deltatap "), (out.returncode, out.stdout, out.stderr)
