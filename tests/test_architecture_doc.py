"""The design document and the code cite each other correctly (issue 19, item 5).

Comments cite ``docs/architecture.md`` by invariant ("invariant 5 (release-once,
docs/architecture.md)") or by section ('docs/architecture.md, "Edges"'), and the document names
the tests that check each invariant. These tests fail when a citation points nowhere: a comment
citing the design map that lives outside the repository, an invariant number or name the
document does not define, a section it does not have, or a test it names that does not exist.
Pure file reading: no project module is imported.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
SCANNED = ("stream", "pipelines", "queries", "benchmarks", "tests", "deploy")
THIS = Path(__file__).resolve()
# The outside map's name, spelled so that this file does not cite it itself.
OUTSIDE_MAP = "DES" + "IGN"

_INVARIANT_HEADING = re.compile(r"^### Invariant (\d+): ([a-z0-9]+(?:-[a-z0-9]+)*)\s*$", re.M)
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
# "invariant 5 (release-once" or "invariant 5 (release-once)": a number and the name after it.
_NAMED = re.compile(r"\binvariant\s+(\d+)\s+\(([a-z][a-z0-9-]*)\s*[,)]", re.I)
# Any number after "invariant" or "invariants", with an optional range ("invariants 5-7").
_NUMBERED = re.compile(r"\binvariants?\s+(\d+)(?:\s*-\s*(\d+))?", re.I)
_SECTION = re.compile(r'docs/architecture\.md,\s+"([^"]+)"')
_TEST_CITATION = re.compile(r"\b(tests/[\w/]+\.py)::(test_\w+)")


def _python_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py")
                  if p.resolve() != THIS and "__pycache__" not in p.parts)


def _flat(text: str) -> str:
    """``text`` with line breaks inside comments and docstrings joined: a citation wrapped over two
    lines ("invariant 5\\n    # (release-once, ...") reads as one."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#:?[ \t]*)?", " ", text)


def _invariants() -> dict[int, str]:
    return {int(number): name for number, name in _INVARIANT_HEADING.findall(DOC.read_text(encoding="utf-8"))}


def _headings() -> set[str]:
    return {heading.strip() for heading in _HEADING.findall(DOC.read_text(encoding="utf-8"))}


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_document_defines_the_seven_invariants_once_each_with_distinct_names():
    found = _INVARIANT_HEADING.findall(DOC.read_text(encoding="utf-8"))
    numbers = [int(number) for number, _ in found]
    names = [name for _, name in found]
    assert numbers == list(range(1, 8)), f"invariant headings must be 1..7 in order, got {numbers}"
    assert len(set(names)) == 7, f"invariant names must be distinct, got {names}"


def test_no_file_cites_the_design_map_that_is_outside_the_repository():
    pattern = re.compile(rf"\b{OUTSIDE_MAP}(?:\.md)?\b")
    citing = [f"{_where(path)}:{number}"
              for path in [*_python_files(), ROOT / "README.md", ROOT / "deploy" / "README.md",
                           *sorted((ROOT / "docs").glob("*.md"))]
              for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
              if pattern.search(line)]
    assert not citing, f"cite docs/architecture.md instead of {OUTSIDE_MAP}.md: {citing}"


def test_every_invariant_a_comment_names_is_defined_by_the_document_under_that_number():
    invariants = _invariants()
    wrong = []
    for path in _python_files():
        text = _flat(path.read_text(encoding="utf-8"))
        for number, name in _NAMED.findall(text):
            if invariants.get(int(number)) != name:
                wrong.append(f"{_where(path)}: invariant {number} ({name}), the document says "
                             f"{invariants.get(int(number), 'no such invariant')!r}")
        for first, last in _NUMBERED.findall(text):
            for number in (first, last):
                if number and int(number) not in invariants:
                    wrong.append(f"{_where(path)}: invariant {number}, not one of {sorted(invariants)}")
    assert not wrong, "\n".join(wrong)


def test_every_section_a_comment_cites_is_a_heading_of_the_document():
    headings = _headings()
    wrong = [f"{_where(path)}: {section!r}" for path in _python_files()
             for section in _SECTION.findall(_flat(path.read_text(encoding="utf-8")))
             if section not in headings]
    assert not wrong, f"sections cited but not in docs/architecture.md ({sorted(headings)}): {wrong}"


def test_every_test_the_document_names_exists_in_its_file():
    cited = sorted(set(_TEST_CITATION.findall(DOC.read_text(encoding="utf-8"))))
    assert cited, "the document names no test"
    missing = []
    for relative, name in cited:
        path = ROOT / relative
        source = path.read_text(encoding="utf-8") if path.is_file() else ""
        defined = re.search(rf"^\s*(?:async\s+)?def {name}\(", source, re.M)
        if not defined:
            missing.append(f"{relative}::{name}")
    assert not missing, f"docs/architecture.md names tests that do not exist: {missing}"
