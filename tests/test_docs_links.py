"""Nothing in the repository points outside it: a user who clones the project has every file
the docs and the code refer to. Every Markdown link that is not a URL names a file of the
repository (and a heading of it, for a #fragment), and no text file names a ``../`` path that
leaves the repository or names nothing in it, nor a path on the machine that wrote it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ESCAPING = re.compile(r"(?<![\w./])((?:\.\./)+[\w.-]+(?:/[\w.-]+)*)")
MACHINE = re.compile(r"(?<![\w.])/(?:work|home|root|tmp/pytest-of)/[\w.-]+")
TEXT = {".md", ".py", ".toml", ".txt", ".yaml", ".yml", ".json", ".cfg", ".ini", ".sh", ""}


def _tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True, timeout=30).stdout.split()
    return [ROOT / n for n in names
            if Path(n).suffix in TEXT and not n.startswith("tests/kvcs/vectors/")]


def _anchors(doc: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings, and its explicit ``id=``/``name=``s."""
    text = doc.read_text()
    out = set(re.findall(r"""(?:id|name)=["']([^"']+)["']""", text))
    for heading in re.findall(r"^#+\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        out.add(slug)
    return out


def _escapes(target: str, base: Path) -> bool:
    """``target`` (relative to ``base``) leaves the repository, or names nothing in it."""
    dest = (base / target).resolve()
    return not (dest.is_relative_to(ROOT) and dest.exists())


def test_every_markdown_link_stays_in_the_repository() -> None:
    bad = []
    for doc in (p for p in _tracked() if p.suffix == ".md"):
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL: a public name, not a file
                continue
            path, _, fragment = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not dest.is_relative_to(ROOT) or not dest.exists():
                bad.append(f"{where} is not a file of the repository")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                bad.append(f"{where}: {dest.name} has no heading #{fragment}")
    assert bad == []


def test_no_text_names_a_path_outside_the_repository() -> None:
    bad = []
    for f in _tracked():
        if f == Path(__file__).resolve():
            continue  # its own examples of what is caught (below)
        try:
            text = f.read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        rel = f.relative_to(ROOT)
        bad += [f"{rel}: {m}" for m in ESCAPING.findall(text) if _escapes(m, f.parent)]
        bad += [f"{rel}: {m}" for m in MACHINE.findall(text)]
    assert bad == []


def test_the_checks_see_a_link_outside() -> None:
    """What README.md:4 and docs/relay.md:3 once held is caught."""
    line = "as profiled in `../shared/spec/MOQT-PROFILE.md` and [it](../shared/spec/x.md)"
    assert [m for m in ESCAPING.findall(line) if _escapes(m, ROOT)] == [
        "../shared/spec/MOQT-PROFILE.md", "../shared/spec/x.md"]
    # from docs/, ../shared is in the repository's folder, but there is no such file
    assert _escapes("../shared/spec/MOQT-PROFILE.md", ROOT / "docs")
    assert not _escapes("../docs/relay.md", ROOT / "docs")
    assert MACHINE.findall("see /work/shared/spec/MOQT-PROFILE.md") == ["/work/shared"]
