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

Op = tuple[str, str]  # (" ", "-" or "+", a line of the diff without its mark)


def survivors(folder: str, pattern: str) -> list[str]:
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("mutation_report.py")),
                          str(Path(folder) / "mutants"), "--survivors"],
                         capture_output=True, text=True, check=False).stdout
    return [n.strip() for n in out.splitlines() if "mutmut_" in n and re.search(pattern, n)]


def parse(diff: str) -> tuple[str, list[list[Op]]]:
    """The file and the hunks of one ``mutmut show`` diff."""
    path, hunks = "", []
    ops: list[Op] = []
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[4:].strip()
        elif line.startswith(("+++ ", "#")):
            continue
        elif line.startswith("@@"):
            if ops:
                hunks.append(ops)
            ops = []
        elif line[:1] in (" ", "-", "+"):
            ops.append((line[0], line[1:]))
    if ops:
        hunks.append(ops)
    return path, hunks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def apply(src: str, hunks: list[list[Op]]) -> str | None:
    """``src`` with the hunks applied; None if a hunk's lines are not found exactly once.
    mutmut prints a function's source re-indented (continuation lines are not), so lines
    are matched without their indentation, and an added line is indented like the file's
    line it replaces."""
    lines = src.split("\n")
    for ops in hunks:
        old = [t.strip() for op, t in ops if op != "+"]
        hits = [i for i in range(len(lines) - len(old) + 1)
                if [x.strip() for x in lines[i:i + len(old)]] == old]
        if len(hits) != 1:
            return None
        at = hits[0]
        out: list[str] = []
        pos = at
        shift = 0
        for op, text in ops:
            if op == " ":
                out.append(lines[pos])
                shift = _indent(lines[pos]) - _indent(text)
                pos += 1
            elif op == "-":
                shift = _indent(lines[pos]) - _indent(text)
                pos += 1
            else:
                out.append(" " * max(0, _indent(text) + shift) + text.lstrip() if text else text)
        lines[at:pos] = out
    return "\n".join(lines)


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
