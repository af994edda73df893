"""The README and docs/ stay true: their commands run, their links resolve (issue 31, item 7).

Every fenced ``bash`` or ``python`` block of README.md and docs/*.md carries a directive, an HTML
comment on the line just before it, which GitHub does not show:

    <!-- docs-test: run [FIXTURE] [slow]; name: LABEL; after: LABEL; expect: TEXT; expect: TEXT -->
    <!-- docs-test: skip: WHY -->

``run``: the block is run in a new folder holding FIXTURE (:data:`FIXTURES`; none: an empty
folder), a bash block by ``bash -e`` with this checkout's ``renyi-stream`` first on the PATH, a
python block by this checkout's Python; it must exit 0, and each ``expect`` TEXT must be in what
it printed (stdout and stderr; runs of whitespace compare as one space, so a table row of the
docs may be written with single spaces; TEXT holds no ``;``). ``after: LABEL`` runs the block
named LABEL (on any page) first, in the same folder; for a python block its code comes first in
the same program, so the later block may use its names. ``slow`` marks the test ``slow``. ``skip``: the block is
not run, and the directive says why (a benchmark, an install, elided options); a reason that
names a test file names one that exists. The options every documented ``renyi-stream`` command
gives, run or not, are options of that command (or, for the Beam jobs, of Beam).

Pure file reading, except the run blocks, the ``--help`` of every documented subcommand and
the small demo the ``demo`` fixture writes (300 users x 3 days).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DEPLOY_README = ROOT / "deploy" / "README.md"
#: Pages whose fenced blocks carry directives and are run.
PAGES = (README, *sorted(DOCS.glob("*.md")))
#: Pages whose links and documented commands are checked too.
LINKED_PAGES = (*PAGES, DEPLOY_README)
#: The Quickstart's two commands: `.ci/run` runs the second, exactly.
QUICKSTART = ("pip install . && renyi-stream demo", "pip install '.[test]' && python -m pytest")
#: Fenced blocks in these languages need a directive (a layout tree or a formula does not).
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "bash", "python": "python"}
#: Subcommands whose unknown options go to Beam (refused there when Beam does not know them).
BEAM_JOBS = {"run", "features", "stream", "distributed"}
BLOCK_TIMEOUT_S = 600

_FENCE = re.compile(r"^```([\w-]*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page and its directive."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    action: str = ""  # "run" or "skip"
    fixture: str = ""
    slow: bool = False
    name: str = ""
    after: str = ""
    expect: tuple[str, ...] = ()
    reason: str = ""
    problems: tuple[str, ...] = field(default=())

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _parse_directive(text: str) -> dict:
    """``run demo slow; name: x; expect: y`` or ``skip: why`` as fields of :class:`Block`, and
    what is wrong with it under ``problems``."""
    if text.startswith("skip"):
        reason = text[len("skip"):].strip()
        if not reason.startswith(":") or not reason[1:].strip():
            return {"action": "skip", "problems": (f"'skip: WHY' needs its reason, got {text!r}",)}
        return {"action": "skip", "reason": reason[1:].strip()}
    parts = [p.strip() for p in text.split(";")]
    head, fields, problems = parts[0], {}, []
    words = head.split()
    if not words or words[0] != "run":
        return {"problems": (f"a directive is 'run ...' or 'skip: WHY', got {text!r}",)}
    fields.update(action="run", slow="slow" in words[1:])
    rest = [w for w in words[1:] if w != "slow"]
    if len(rest) > 1:
        problems.append(f"'run' takes at most one fixture, got {rest}")
    fields["fixture"] = rest[0] if rest else ""
    expect = []
    for part in parts[1:]:
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            problems.append(f"expected 'key: value', got {part!r}")
        elif key == "expect":
            expect.append(value)
        elif key in ("name", "after"):
            fields[key] = value
        else:
            problems.append(f"unknown key {key!r} (name, after, expect)")
    fields.update(expect=tuple(expect), problems=tuple(problems))
    return fields


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a fenced block that is never closed"
        directive = _DIRECTIVE.match(lines[i - 1]) if i > 0 else None
        fields = _parse_directive(directive.group(1)) if directive else {}
        blocks.append(Block(page=page, line=i + 1, lang=opening.group(1), code="\n".join(lines[i + 1:end]) + "\n",
                            **fields))
        i = end + 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in _blocks(page)]
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.action == "run"]
NAMED = {b.name: b for b in RUN_BLOCKS if b.name}


# ---------------------------------------------------------------------------------------------
# The directives themselves


def test_every_shell_and_python_block_says_whether_it_is_run():
    missing = [f"{b.where} ({b.lang})" for b in ALL_BLOCKS if b.lang in RUNNABLE and not b.action]
    assert not missing, ("give each block a '<!-- docs-test: run ... -->' or '<!-- docs-test: skip: WHY -->' on "
                         f"the line before it: {missing}")
    stray = [b.where for b in ALL_BLOCKS if b.action and b.lang not in RUNNABLE]
    assert not stray, f"directives on blocks of no runnable language: {stray}"
    assert RUN_BLOCKS, "no block is run"


def test_every_directive_is_well_formed():
    wrong = [f"{b.where}: {p}" for b in ALL_BLOCKS for p in b.problems]
    names = [b.name for b in RUN_BLOCKS if b.name]
    wrong += [f"block name {n!r} used twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for b in RUN_BLOCKS:
        if b.fixture and b.fixture not in FIXTURES:
            wrong.append(f"{b.where}: unknown fixture {b.fixture!r} (one of {sorted(FIXTURES)})")
        if b.after and b.after not in NAMED:
            wrong.append(f"{b.where}: after {b.after!r}, which no block is named")
        elif b.after and NAMED[b.after].lang != b.lang:
            wrong.append(f"{b.where}: after {b.after!r}, a block in another language")
        if b.after and b.fixture:
            wrong.append(f"{b.where}: a block run after another runs in its folder, so it takes no fixture")
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        wrong += [f"{page.relative_to(ROOT)}:{i + 1}: a directive not on the line just before a fenced block"
                  for i, line in enumerate(lines)
                  if "<!-- docs-test" in line and (i + 1 == len(lines) or not _FENCE.match(lines[i + 1]))]
    for b in ALL_BLOCKS:
        for test_file in re.findall(r"\btests/[\w/]+\.py\b", b.reason):
            if not (ROOT / test_file).is_file():
                wrong.append(f"{b.where}: the skip reason names {test_file}, which does not exist")
    assert not wrong, "\n".join(wrong)


def test_the_quickstart_keeps_its_two_commands_and_ci_runs_the_second():
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Quickstart") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## ")) + 1
    blocks = [b.code.strip() for b in _blocks(README) if start < b.line < end]
    assert blocks == list(QUICKSTART), f"the Quickstart's commands are {blocks}"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == QUICKSTART[1], f".ci/run must end with the README's test command, ends with {ci[-1]!r}"


# ---------------------------------------------------------------------------------------------
# Links


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, inline markup and punctuation other than
    ``-`` and ``_`` dropped, spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, seen, fenced = set(), {}, False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else _HEADING.match(line)
        if heading:
            slug = github_anchor(heading.group(2))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _prose(page: Path) -> str:
    """``page`` without its fenced blocks."""
    return re.sub(r"(?ms)^```.*?^```[ \t]*$", "", page.read_text(encoding="utf-8"))


def test_every_relative_link_points_at_a_file_and_heading_that_exist():
    wrong = []
    for page in LINKED_PAGES:
        for target in _LINK.findall(_prose(page)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not resolved.exists():
                wrong.append(f"{where}: no file {path}")
            elif ROOT not in resolved.parents and resolved != ROOT:
                wrong.append(f"{where}: outside the repository")
            elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
                wrong.append(f"{where}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_links_every_page_of_the_manual():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in _LINK.findall(_prose(README))}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def _cited_sections() -> list[tuple[str, str, str]]:
    """``(where, page, section)`` of every 'docs/PAGE.md, "Section"' citation in the code and pages."""
    pattern = re.compile(r'docs/(\w+)\.md,?\s+(?:#\s*)?"([^"]+)"')
    found = []
    files = [p for folder in ("stream", "pipelines", "queries", "benchmarks", "tests", "deploy")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh") and "__pycache__" not in p.parts]
    for path in [p for p in [*files, *LINKED_PAGES] if p.resolve() != Path(__file__).resolve()]:
        text = re.sub(r"[ \t]*\n[ \t]*(?:#:?[ \t]*)?", " ", path.read_text(encoding="utf-8"))
        found += [(str(path.relative_to(ROOT)), page, section) for page, section in pattern.findall(text)]
    return found


def test_every_section_the_code_cites_in_a_docs_page_is_a_heading_of_that_page():
    # A heading "Bounds: what one running query may cost a job" may be cited as "Bounds".
    wrong = []
    for where, page, section in _cited_sections():
        path = DOCS / f"{page}.md"
        headings = ({_HEADING.match(line).group(2) for line in path.read_text(encoding="utf-8").splitlines()
                     if _HEADING.match(line)} if path.is_file() else set())
        if section not in headings | {h.split(":")[0] for h in headings}:
            wrong.append(f"{where}: docs/{page}.md, {section!r}")
    assert not wrong, "sections cited but not headings of their page:\n" + "\n".join(wrong)


def test_every_path_the_pages_name_in_code_exists():
    folders = ("stream", "pipelines", "queries", "benchmarks", "tests", "deploy", "docs")
    pattern = re.compile(rf"^(?:{'|'.join(folders)})/[\w./-]*$")
    wrong = []
    for page in LINKED_PAGES:
        for span in _INLINE_CODE.findall(_prose(page)):
            path, _, test = span.partition("::")
            if not pattern.match(path) or any(c in path for c in "*<>"):
                continue
            target = ROOT / path
            if not target.exists():
                wrong.append(f"{page.relative_to(ROOT)}: `{span}`")
            elif test and not re.search(rf"^\s*def {re.escape(test)}\(", target.read_text(encoding="utf-8"), re.M):
                wrong.append(f"{page.relative_to(ROOT)}: `{span}` (no such test)")
    assert not wrong, "paths named in the docs that do not exist:\n" + "\n".join(wrong)


# ---------------------------------------------------------------------------------------------
# Documented commands: every subcommand's --help, every option


def _help(argv: list[str]) -> str:
    """What ``renyi-stream ARGV --help`` prints; fails the test unless it exits 0."""
    from renyi_stream.pipelines.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0, f"renyi-stream {' '.join(argv)} --help exited {exit_info.value.code}: " \
                                      f"{err.getvalue()}"
    return out.getvalue()


def _commands(code: str) -> list[list[str]]:
    """The words of each ``renyi-stream`` command in a shell block, from the subcommand on."""
    code = re.sub(r"(?m)(?:^|(?<=\s))#[^\n]*", "", code.replace("\\\n", " "))
    lex = shlex.shlex(code, posix=True, punctuation_chars=";&|\n")
    lex.whitespace, lex.whitespace_split, lex.commenters = " \t", True, ""
    commands, current = [], None
    for token in lex:
        if token and set(token) <= set(";&|\n"):
            current = None
        elif token == "renyi-stream":
            current = []
            commands.append(current)
        elif current is not None:
            current.append(token)
    return commands


def _documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in LINKED_PAGES:
        for block in _blocks(page):
            if RUNNABLE.get(block.lang) == "bash":
                found += [(f"{block.where}", words) for words in _commands(block.code)]
        for span in _INLINE_CODE.findall(_prose(page)):
            if span.startswith("renyi-stream "):
                found += [(f"{page.relative_to(ROOT)} (`{span}`)", words) for words in _commands(span)]
    return found


def _subcommand(words: list[str]) -> tuple[str, ...]:
    """The subcommand (and action, for ``query``) ``words`` start with."""
    if not words or words[0].startswith("-"):
        return ()
    if words[0] == "query" and len(words) > 1 and not words[1].startswith("-"):
        return tuple(words[:2])
    return (words[0],)


def test_every_documented_subcommand_has_a_help_that_parses():
    subcommands = {_subcommand(words) for _, words in _documented_commands()} - {()}
    assert {("run",), ("stream",), ("distributed",), ("features",), ("train",), ("sql",)} <= subcommands
    top = _help([])
    for sub in sorted(subcommands):
        assert re.search(rf"^\s+{re.escape(sub[0])}\s", top, re.M), f"renyi-stream --help does not list {sub[0]!r}"
        _help(list(sub))


def test_every_option_a_documented_command_gives_is_an_option_of_that_command():
    from renyi_stream.pipelines.beam.job_options import beam_options

    helps: dict[tuple[str, ...], str] = {}
    beam = None
    wrong = []
    for where, words in _documented_commands():
        sub = _subcommand(words)
        if not sub:
            continue
        if sub not in helps:
            helps[sub] = _help(list(sub))
        for word in words[len(sub):]:
            option = word.split("=", 1)[0]
            if not option.startswith("--") or option == "--":
                continue
            if re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", helps[sub]):
                continue
            if sub[0] in BEAM_JOBS:
                beam = beam_options() if beam is None else beam
                if option in beam:
                    continue
            wrong.append(f"{where}: renyi-stream {' '.join(sub)} {option}")
    assert not wrong, "options the documented commands do not have:\n" + "\n".join(wrong)


# ---------------------------------------------------------------------------------------------
# Running the blocks


def _demo(folder: Path) -> None:
    """``renyi-demo/`` as the Quickstart's demo writes it, small: 300 users x 3 days
    (2026-01-01 to 2026-01-03)."""
    from renyi_stream.pipelines.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--users", "300", "--days", "3", "--out", str(folder / "renyi-demo"), "--quiet"]) == 0


def _day_file(folder: Path) -> None:
    """``day-2026-03-01.parquet``: five users' ``opened_app`` and ``minutes`` on 2026-03-01."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({
        "user_id": pa.array([1, 2, 3, 4, 5], type=pa.int64()),
        "day": pa.array([dt.date(2026, 3, 1)] * 5, type=pa.date32()),
        "opened_app": [1.0, 0.0, 1.0, 1.0, 0.0],
        "minutes": [3.0, 1.0, 0.0, 2.0, 4.0],
    }), folder / "day-2026-03-01.parquet")


#: What a ``run FIXTURE`` block finds in its folder.
FIXTURES = {"demo": _demo, "day-file": _day_file}


def _console_script(bin_dir: Path) -> Path:
    """An executable ``renyi-stream`` that runs this checkout's entry point (pyproject.toml's
    ``[project.scripts]``), whatever is installed."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["renyi-stream"]
    module, function = entry.split(":")
    script = bin_dir / "renyi-stream"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\n"
                      f"sys.exit({function}())\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict[str, str]:
    bin_dir = tmp_path_factory.mktemp("bin")
    _console_script(bin_dir)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               MPLBACKEND="Agg")
    return env


@pytest.fixture(scope="module")
def fixture_folders(tmp_path_factory):
    """FIXTURE name -> a folder holding it, made once per module and copied for each block."""
    made: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(f"fixture-{name}")
            FIXTURES[name](made[name])
        return made[name]

    return folder


def _run(block: Block, code: str, folder: Path, env: dict[str, str]) -> str:
    """Run ``code`` (``block``'s language) in ``folder``; its output, after checking it exited 0."""
    script = folder / (".docs-block.sh" if RUNNABLE[block.lang] == "bash" else ".docs-block.py")
    script.write_text(code)
    command = ["bash", "-e", "-o", "pipefail", str(script)] if RUNNABLE[block.lang] == "bash" \
        else [sys.executable, str(script)]
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    script.unlink()
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{block.where} exited {result.returncode}:\n{code}\n--- output ---\n{output[-6000:]}"
    return output


class Finished(dict):
    """Block name -> a copy of its folder once it has run and passed, so that a block run after it
    starts from that copy instead of running it again (when both run in one process)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def keep(self, name: str, folder: Path) -> None:
        self[name] = self.root / name
        shutil.copytree(folder, self[name], symlinks=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Finished:
    return Finished(tmp_path_factory.mktemp("finished"))


def _chain(block: Block) -> list[Block]:
    """The blocks to run, in order: those ``block`` runs after, then ``block``."""
    chain = [block]
    while chain[0].after:
        assert len(chain) <= len(RUN_BLOCKS), f"{block.where}: 'after' goes round in a circle"
        chain.insert(0, NAMED[chain[0].after])
    return chain


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where, marks=[pytest.mark.slow] if b.slow else [])
                                   for b in RUN_BLOCKS])
def test_the_documented_block_runs(block, tmp_path, shell_env, fixture_folders, finished):
    chain = _chain(block)
    folder = tmp_path / "work"
    if RUNNABLE[block.lang] == "python":
        folder.mkdir()
        output = _run(block, "\n".join(b.code for b in chain), folder, shell_env)
    else:
        done = max((i for i, b in enumerate(chain[:-1]) if b.name in finished), default=None)
        if done is not None:
            shutil.copytree(finished[chain[done].name], folder, symlinks=True)
            chain = chain[done + 1:]
        elif chain[0].fixture:
            shutil.copytree(fixture_folders(chain[0].fixture), folder, symlinks=True)
        else:
            folder.mkdir()
        for earlier in chain[:-1]:
            _run(earlier, earlier.code, folder, shell_env)
        output = _run(block, block.code, folder, shell_env)
    flat = " ".join(output.split())
    missing = [text for text in block.expect if " ".join(text.split()) not in flat]
    assert not missing, f"{block.where}: the output lacks {missing}:\n{output[-6000:]}"
    if block.name and RUNNABLE[block.lang] == "bash":
        finished.keep(block.name, folder)
