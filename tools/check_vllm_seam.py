"""Check the seam table (`vllm_idlm/seam/table.py`) against another vLLM release's sources.

    python tools/check_vllm_seam.py vllm-0.34.0-...whl [DIR ...]

Each argument is a wheel (`pip download --no-deps vllm==X`), an unpacked tree or a
site-packages directory; the sources are read with `ast`, never imported, so the release need
not be installed (nor installable here). For every symbol the plugin patches, calls,
subclasses or reads it reports whether it is where the table says, with the same signature
and attributes, and what moved or vanished. Exit status 1 when something the plugin relies on
breaks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_idlm.seam.sources import VllmSources, check  # noqa: E402
from vllm_idlm.seam.table import TABLE  # noqa: E402


def report(root: str) -> tuple[str, int]:
    sources = VllmSources(root)
    findings = [(touch, check(sources, touch)) for touch in TABLE]
    broken = [(t, f) for t, f in findings if f is not None and f.status == "breaks"]
    compatible = [(t, f) for t, f in findings if f is not None and f.status == "compatible"]
    patches = sum(t.kind in ("wrap", "replace", "add") for t in TABLE)
    broken_patches = sum(t.kind in ("wrap", "replace", "add") for t, _ in broken)
    lines = [
        f"vLLM {sources.version} ({Path(root).name}): {len(TABLE) - len(broken)} of "
        f"{len(TABLE)} touches hold; {len(broken)} break ({broken_patches} of {patches} "
        f"patches), {len(compatible)} changed compatibly"
    ]
    for title, rows in (("breaks", broken), ("changed compatibly", compatible)):
        if rows:
            lines.append(f"  {title}:")
            lines += [f"    {t.target} [{t.kind}]: {f.message}" for t, f in rows]
    return "\n".join(lines), len(broken)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="+", help="wheel, unpacked tree or site-packages")
    args = parser.parse_args(argv)
    failed = 0
    for root in args.releases:
        text, broken = report(root)
        print(text)
        failed += broken > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
