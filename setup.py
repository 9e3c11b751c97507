"""Package discovery under our import names; everything else is in pyproject.toml.

Two folders are imported under other names ([tool.setuptools.package-dir]: `training/` is
`idlm_training`, `kernels/` is `idlm_kernels`, because `kernels` is Hugging Face's Kernel Hub
package), and setuptools' own discovery (`[tool.setuptools.packages.find]`) names a package
after its folder, so it cannot be used. A hand-kept list missed `vllm_idlm.on_ray`, so every
non-editable install lacked it. Namespace discovery also takes in data-only folders such as
`training/configs`, which setuptools warns about when they are left out of `packages`.
"""

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = []
    for name, folder in config["tool"]["setuptools"]["package-dir"].items():
        subpackages = find_namespace_packages(ROOT / folder, exclude=["*__pycache__*"])
        found += [name] + [f"{name}.{sub}" for sub in subpackages]
    return found


setup(packages=packages())
