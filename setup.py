"""Package layout only (everything else is in pyproject.toml).

The top-level folders are the architecture (proxy/, loadgen/, collector/, stack/, configs/); they install as
sub-packages of the one import namespace ``deltatap``. A new sub-package under any of them is picked up here.
"""

from setuptools import find_packages, setup

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

setup(packages=packages, package_dir={"deltatap": "deltatap", **FOLDERS})
