"""The mutation score per module from mutmut's results (``mutants/**/*.meta``), for
``make mutate``.

Score = killed / (killed + survived), over the mutants that were run; timeouts count as
killed (a mutant that hangs the suite is caught), mutants no test reaches count as survived
(nothing guards that code). Mutants judged equivalent in docs/testing.md are listed there and
not subtracted here: this prints the raw numbers.

usage: python scripts/mutation_report.py [MUTANTS_DIR] [--survivors]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

KILLED = {1, 3, 36, 24, -24, 152, 255, -9, -11}
SURVIVED = {0}
NO_TESTS = {5, 33}


def module_of(meta: Path, root: Path) -> str:
    rel = meta.relative_to(root).with_suffix("").with_suffix("")
    return ".".join(rel.parts)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    show_survivors = "--survivors" in argv
    root = Path(args[0] if args else "mutants")
    metas = sorted(root.rglob("*.py.meta"))
    if not metas:
        print(f"no mutmut results under {root}/: run `make mutate` first")
        return 1
    print(f"{'module':34} {'mutants':>7} {'run':>5} {'killed':>6} {'survived':>8} "
          f"{'no test':>7} {'score':>6}")
    survivors: list[str] = []
    for meta in metas:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        c = Counter("killed" if v in KILLED else "survived" if v in SURVIVED else
                    "no tests" if v in NO_TESTS else "not run" if v is None else "other"
                    for v in codes.values())
        run = len(codes) - c["not run"]
        if run == 0:
            continue
        judged = c["killed"] + c["survived"] + c["no tests"]
        score = f"{100 * c['killed'] / judged:5.1f}%" if judged else "   -"
        print(f"{module_of(meta, root):34} {len(codes):7} {run:5} {c['killed']:6} "
              f"{c['survived']:8} {c['no tests']:7} {score:>6}")
        survivors += [k for k, v in codes.items() if v in SURVIVED or v in NO_TESTS]
    if show_survivors:
        print("\nsurvivors (see each with `mutmut show NAME` in the folder above mutants/):")
        for name in survivors:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
