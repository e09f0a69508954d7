"""The application shell: the ``deltatap`` console script (``cli``), ``deltatap demo`` (``demo``) and the
generated reference page (``refdoc``). The top floor: it may import every package below it.
"""


def main() -> int:
    """The console script: :func:`deltatap.app.cli.main`, imported here so that a Ctrl-C while the interpreter is still
    importing the command line (pydantic, yaml: ~0.1 s) ends with status 130 like one during a command, not a
    traceback."""
    try:
        from deltatap.app.cli import main as run

        return run()
    except KeyboardInterrupt:
        return 130
