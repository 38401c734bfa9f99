"""Re-check mutmut's survivors against the tests as they are now, in minutes instead of
mutmut's hours: apply each survivor's change (``mutmut show``) to this checkout, run the given
tests, put the file back. A test written to kill a survivor is proved this way before the next
full ``make mutate``.

Prints ``killed``, ``SURVIVED``, or ``n/a`` when the mutated code is no longer in the file (it
was rewritten since). The file is always restored, also on Ctrl-C.

usage: python scripts/mutation_recheck.py MUTMUT_FOLDER NAME_REGEX -- PYTEST_ARGS...
e.g.   python scripts/mutation_recheck.py . 'track.*_resolve' -- tests/core/test_relay_unknown.py
(MUTMUT_FOLDER holds ``mutants/`` from a ``make mutate`` run; the tests run in this checkout.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

Hunk = tuple[list[str], list[str]]


def survivors(folder: str, pattern: str) -> list[str]:
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("mutation_report.py")),
                          str(Path(folder) / "mutants"), "--survivors"],
                         capture_output=True, text=True, check=False).stdout
    return [n.strip() for n in out.splitlines() if "mutmut_" in n and re.search(pattern, n)]


def parse(diff: str) -> tuple[str, list[Hunk]]:
    """The file and the hunks (old lines, new lines) of one ``mutmut show`` diff. mutmut
    prints a function's source dedented; ``apply`` puts the indentation back."""
    path, hunks = "", []
    old: list[str] = []
    new: list[str] = []
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[4:].strip()
        elif line.startswith(("+++ ", "#")):
            continue
        elif line.startswith("@@"):
            if old or new:
                hunks.append((old, new))
            old, new = [], []
        elif line.startswith("-"):
            old.append(line[1:])
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith(" "):
            old.append(line[1:])
            new.append(line[1:])
    if old or new:
        hunks.append((old, new))
    return path, hunks


def apply(src: str, hunks: list[Hunk]) -> str | None:
    for old, new in hunks:
        for indent in ("", "    ", "        "):
            o = "\n".join(indent + x if x else x for x in old)
            if src.count(o) == 1:
                src = src.replace(o, "\n".join(indent + x if x else x for x in new))
                break
        else:
            return None
    return src


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv[:argv.index("--")]) != 2:
        print(__doc__)
        return 2
    folder, pattern = argv[:2]
    pytest_args = argv[argv.index("--") + 1:]
    mutmut = Path(sys.executable).with_name("mutmut")  # `make mutate` installs it here
    if not mutmut.exists():
        mutmut = Path(folder).resolve() / ".venv" / "bin" / "mutmut"
    for name in survivors(folder, pattern):
        diff = subprocess.run([str(mutmut), "show", name], cwd=folder, capture_output=True,
                              text=True, check=False).stdout
        path, hunks = parse(diff)
        target = Path(path)
        src = target.read_text()
        mutated = apply(src, hunks)
        if mutated is None:
            print(f"n/a       {name}", flush=True)
            continue
        target.write_text(mutated)
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly",
                                 *pytest_args], capture_output=True, check=False).returncode
        finally:
            target.write_text(src)
        verdict = {0: "SURVIVED", 1: "killed"}.get(rc, f"error {rc}")  # 5: no test ran
        print(f"{verdict:9} {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
