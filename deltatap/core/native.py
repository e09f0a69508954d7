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
