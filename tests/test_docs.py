"""The README and the pages under docs/: every relative link and image resolves (the file
exists; an #anchor names a heading of its page under GitHub's slug rules), the README stays
short, links every page, and its headline rows are rows of the generated results table."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold `code`.
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^(https?://|mailto:)", re.IGNORECASE)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted((DOCS / "results").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fenced = [], None
    for number, line in enumerate(text.split("\n"), 1):
        fence = FENCE.match(line)
        if fence:
            if fenced is None:
                fenced = fence.group(1)
            elif fence.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (links by their text, code and
    emphasis markers dropped), lowercased, every character other than a letter, digit, space,
    hyphen or underscore removed, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub makes for the headings of `page` (a repeated slug gets -1, -2...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link, image and reference definition of
    `page` outside fenced code blocks and code spans."""
    out = []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        definition = REFERENCE_DEF.match(line)
        if definition:
            out.append((number, definition.group(1)))
            continue
        line = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)
        out += [(number, m.group(2)) for m in INLINE_LINK.finditer(line)]
    return out


def link_problems(page: Path) -> list[str]:
    """What is wrong with the relative links of `page`, one line per broken link."""
    problems = []
    for number, target in links(page):
        if EXTERNAL.match(target):
            continue
        where = f"{page.name}:{number}: {target!r}"
        if not target:
            problems.append(f"{where}: empty target")
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            problems.append(f"{where}: {dest} does not exist")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix.lower() != ".md":
                problems.append(f"{where}: an anchor into a file that is not a Markdown page")
            elif unquote(anchor).lower() not in anchors(dest):
                problems.append(f"{where}: no heading of {dest.name} has the anchor #{anchor}")
    return problems


def table_rows(text: str, header_start: str, every: bool = False) -> list[str]:
    """The rows (header and separator included) of the first table whose header row starts
    with `header_start`, or (every) of all such tables."""
    lines, rows = text.split("\n"), []
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                rows.append(row)
            if not every:
                break
    return rows


def test_every_link_resolves():
    assert links(README), "no link found in README.md: the link pattern is broken"
    problems = [problem for page in pages() for problem in link_problems(page)]
    assert not problems, "\n".join(problems)


def test_readme_is_short_and_links_every_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for _, target in links(README) if not EXTERNAL.match(target)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_headline_rows_are_rows_of_the_results_table():
    """The README's headline table is a copy of some rows of a paired table of
    docs/results/ (made by `fedgo_lab.report --paired`): every row must still be there."""
    header = "| K | alpha |"
    headline = table_rows(README.read_text(encoding="utf-8"), header)
    full = [row for page in sorted((DOCS / "results").glob("*.md"))
            for row in table_rows(page.read_text(encoding="utf-8"), header, every=True)]
    assert len(headline) > 2 and full
    stale = [row for row in headline if row not in full]
    assert not stale, "README headline rows not in docs/results/:\n" + "\n".join(stale)


def test_slugs_follow_github():
    assert slug("Two commands (fresh Linux machine with Python 3.11+, Flower's floor)") == \
        "two-commands-fresh-linux-machine-with-python-311-flowers-floor"
    assert slug("The toy example (paper, Figure 1 / App. E.1)") == \
        "the-toy-example-paper-figure-1--app-e1"
    assert slug("FedAvg, FedDF, FedGO and the baselines under one protocol "
                "(`conf/bench/fmnist-fair.yaml`)") == \
        "fedavg-feddf-fedgo-and-the-baselines-under-one-protocol-confbenchfmnist-fairyaml"
    assert slug("odds β=4 and snake_case_key") == "odds-β4-and-snake_case_key"


def test_checker_catches_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Same\n\n## Same\n")
    (tmp_path / "pic.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "# A page",
        "",
        "## Section: one (two)",
        "",
        "Fine: [here](#section-one-two), [other](other.md), [2nd](other.md#same-1),",
        "![pic](pic.png), [web](https://example.org/nowhere.md), [mail](mailto:a@b.c),",
        "`[in code](missing-in-code.md)`.",
        "",
        "```",
        "[in a fence](missing-in-fence.md)",
        "```",
        "",
        "Broken: [gone](missing.md), [no heading](#no-such-heading),",
        "![no picture](missing.png), [other's missing](other.md#same-2).",
        "",
        "[ref]: missing-ref.md",
    ]))
    problems = link_problems(page)
    assert len(problems) == 5, "\n".join(problems)
    for target in ("missing.md", "#no-such-heading", "missing.png", "other.md#same-2",
                   "missing-ref.md"):
        assert any(repr(target) in p for p in problems), (target, problems)
    assert not any("in-code" in p or "in-fence" in p for p in problems)
