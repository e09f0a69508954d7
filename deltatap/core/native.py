"""The optional C accelerators: one place decides whether a module's accelerator is used.

Each accelerator (``deltatap/**/_*.c``, built by setup.py when a C compiler is there) does exactly what a
pure-Python reference in the same package does; the reference stays the definition, and a differential test
compares the two on generated inputs. The reference module asks :func:`load` for its accelerator (which records
the pair) and falls back to itself when it gets None.

``DELTATAP_NATIVE=0`` turns every accelerator off (the references run: to compare, or to rule one out);
``DELTATAP_NATIVE=name,name`` keeps only those on. :func:`status` says which are built and which are used
(the tests check that a machine with a C compiler built every one).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load", "status", "ACCELERATORS"]

# every accelerator the project ships: module name -> the reference it stands in for
ACCELERATORS: dict[str, str] = {}


def _wanted(module: str) -> bool:
    setting = os.environ.get("DELTATAP_NATIVE", "1").strip()
    if setting in ("", "1", "on", "yes", "true"):
        return True
    if setting in ("0", "off", "no", "false"):
        return False
    short = module.rsplit(".", 1)[-1].lstrip("_")
    names = {s.strip().lstrip("_") for s in setting.split(",")}
    return short in names or module in names


def load(module: str, reference: str) -> ModuleType | None:
    """The accelerator ``module`` (e.g. ``deltatap.net._pktring``) of the reference module ``reference`` (its
    ``__name__``) when it is built and not turned off, else None (use the reference)."""
    ACCELERATORS[module] = reference
    if not _wanted(module):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def status() -> dict[str, str]:
    """Each registered accelerator: ``used``, ``off`` (DELTATAP_NATIVE) or ``not built`` (the reference runs)."""
    out = {}
    for module in sorted(ACCELERATORS):
        try:
            importlib.import_module(module)
            built = True
        except ImportError:
            built = False
        out[module] = ("used" if _wanted(module) else "off") if built else "not built"
    return out



def extensions(source_root: str) -> list[tuple[str, str]]:
    """``(module, source file)`` of every accelerator the setup.py in ``source_root`` builds (setup.py is the one
    place that names them)."""
    import runpy

    import setuptools

    got: dict = {}
    real, cwd = setuptools.setup, os.getcwd()
    setuptools.setup = lambda **kw: got.update(kw)
    try:
        os.chdir(source_root)
        runpy.run_path(os.path.join(source_root, "setup.py"), run_name="__setup__")
    finally:
        os.chdir(cwd)
        setuptools.setup = real
    return [(e.name, os.path.join(source_root, e.sources[0])) for e in got.get("ext_modules", [])]


def _main(argv: list[str] | None = None) -> int:
    """``python -m deltatap.core.native SOURCE_ROOT``: whether each accelerator the source tree's setup.py builds is
    built and used here; exit 1 when one is not built (an image or CI that must not run the references)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m deltatap.core.native", description=_main.__doc__)
    ap.add_argument("source_root", help="the deltatap source tree (where setup.py is)")
    args = ap.parse_args(argv)
    missing = 0
    for name, _src in extensions(os.path.abspath(args.source_root)):
        try:
            importlib.import_module(name)
            state = "used" if _wanted(name) else "built, off (DELTATAP_NATIVE)"
        except ImportError as exc:
            state, missing = f"NOT BUILT ({exc})", missing + 1
        print(f"{name}: {state}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(_main())
