"""Package layout and the optional C accelerators (everything else is in pyproject.toml).

The top-level folders are the architecture (proxy/, loadgen/, collector/, stack/, configs/); they install as
sub-packages of the one import namespace ``deltatap``. A new sub-package under any of them is picked up here.

C accelerators: every ``_*.c`` file in a package folder is built as that package's extension module
(``deltatap/net/_pktring.c`` -> ``deltatap.net._pktring``). Each is optional: a machine without a C compiler
installs the pure-Python reference, which :mod:`deltatap.core.native` falls back to (and which the
differential tests compare each accelerator with).
"""

from pathlib import Path

from setuptools import Extension, find_packages, setup

FOLDERS = {
    "deltatap.proxy": "proxy",
    "deltatap.loadgen": "loadgen",
    "deltatap.collector": "collector",
    "deltatap.stack": "stack",
    "deltatap.configs": "configs",
}

packages = find_packages(include=["deltatap", "deltatap.*"])
for name, folder in FOLDERS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]
package_dir = {"deltatap": "deltatap", **FOLDERS}


def _folder(pkg: str) -> Path:
    """The source folder of package ``pkg`` (through package_dir)."""
    for prefix in sorted(package_dir, key=len, reverse=True):
        if pkg == prefix or pkg.startswith(prefix + "."):
            rest = pkg[len(prefix):].lstrip(".")
            return Path(package_dir[prefix], *rest.split(".")) if rest else Path(package_dir[prefix])
    return Path(*pkg.split("."))


ext_modules = [
    Extension(
        f"{pkg}.{src.stem}",
        [str(src)],
        depends=["deltatap/net/_slot_api.h"],  # the capsule's struct, shared by _pktring, _content and _relay (in the sdist)
        optional=True,  # no compiler: the pure-Python reference is used
        extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-unused-function"],
    )
    for pkg in packages
    for src in sorted(_folder(pkg).glob("_*.c"))
]

setup(packages=packages, package_dir=package_dir, ext_modules=ext_modules)
