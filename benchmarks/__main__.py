"""`make bench`: run every benchmark module in this folder (bench_*.py), each in turn; a
module with ``ONLY_BY_NAME = True`` (root, half an hour) runs only when named."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benchmarks


def main(argv: list[str]) -> int:
    wanted = set(argv)
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda i: i.name):
        if not info.name.startswith("bench_"):
            continue
        if wanted and info.name not in wanted and info.name.removeprefix("bench_") not in wanted:
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        if getattr(module, "ONLY_BY_NAME", False) and not wanted:
            print(f"({info.name}: only when named, e.g. python -m benchmarks "
                  f"{info.name.removeprefix('bench_')})")
            continue
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
