"""Every relative markdown link in README.md and docs/ (docs/planner/ included: round 19 moved its pages there, and
their "above" / "below" now link across pages) names a file that exists and, with #anchor, a heading of that file
by GitHub's anchor rule -- what a reader clicking it on GitHub lands on. Links in code (fences, indented blocks,
`inline`) are not links; http(s) and mailto are not checked (no network here)."""

from __future__ import annotations

import os
import re
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[str]:
    found = ["README.md"]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        found += sorted(os.path.relpath(os.path.join(d, n), ROOT) for n in names if n.endswith(".md"))
    return found


def prose(text: str):
    """(line number, line) of what renders as prose: not in a fence or an indented code block, inline code cut."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            yield i, re.sub(r"`[^`]*`", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text (links as their text, code and emphasis marks dropped),
    lowercased, every character but letters, digits, marks, '_', '-' and spaces removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "").lower()
    return "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN").replace(" ", "-")


def anchors(path: str) -> set[str]:
    """A page's anchors: each heading's slug (a repeated one gets -1, -2, ... as GitHub numbers them) and any
    <a name=...> / id=...."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in open(path, encoding="utf-8").read().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            s = slug(m.group(2))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
        out.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', line))
    return out


def broken_links(page: str, root: str = ROOT) -> list[str]:
    """'page:line: target: why' for each relative link of `page` that does not resolve."""
    bad = []
    for n, line in prose(open(os.path.join(root, page), encoding="utf-8").read()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(root, os.path.dirname(page), path)) if path else os.path.join(root,
                                                                                                            page)
            if not os.path.exists(full):
                bad.append(f"{page}:{n}: {target}: no such file")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                bad.append(f"{page}:{n}: {target}: no heading with that anchor in {os.path.relpath(full, root)}")
    return bad


@pytest.mark.parametrize("page", pages())
def test_every_relative_link_names_an_existing_file_and_heading(page):
    assert broken_links(page) == []


def test_the_planner_pages_link_across_pages():
    """The pages round 19 split: their cross-page references are links (so the test above checks them)."""
    text = {p: open(os.path.join(ROOT, "docs", "planner", p), encoding="utf-8").read()
            for p in ("validation.md", "rounds.md")}
    assert len(re.findall(r"\]\(rounds\.md#", text["validation.md"])) >= 8, "validation.md -> rounds.md sections"
    assert len(re.findall(r"\]\(validation\.md#", text["rounds.md"])) >= 6, "rounds.md -> validation.md sections"


@pytest.mark.parametrize("heading, anchor", [
    ("Held-out error (heldout.py)", "held-out-error-heldoutpy"),
    ("FP8 casts (`--fp8-scaling`, issue 26, seventh round)", "fp8-casts---fp8-scaling-issue-26-seventh-round"),
    ("Overlapped ZeRO 3 collectives are not free (issue 26, sixth round: the AC / no-AC lean)",
     "overlapped-zero-3-collectives-are-not-free-issue-26-sixth-round-the-ac--no-ac-lean"),
    ("Published runs outside shared/reference (published.py)", "published-runs-outside-sharedreference-publishedpy"),
    ("Round 17: one Triton rate on both cards (issue 26, 2026-12-07: hybrid/planner/published17_triton.py)",
     "round-17-one-triton-rate-on-both-cards-issue-26-2026-12-07-hybridplannerpublished17_tritonpy"),
    ("**Bold** and [a link](x.md) — é", "bold-and-a-link--é"),
])
def test_slug_is_githubs_anchor(heading, anchor):
    """GitHub's rule, by hand: lowercase; '.', '/', ':', '(', ')', ',', '`', '*' and '—' dropped; each space a '-'
    (so ' / ' and ' -- ' leave runs of '-'); letters outside ASCII kept."""
    assert slug(heading) == anchor


def test_a_broken_file_or_anchor_is_found_and_code_is_not_a_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B page\n\n## Two words\n\n## Two words\n")
    (tmp_path / "docs" / "a.md").write_text(
        "[ok](b.md) [ok](b.md#two-words) [ok](b.md#two-words-1) [ok](#a-page) [ok](https://x.org/#nothing)\n"
        "# A page\n"
        "[gone](c.md) [no anchor](b.md#three-words)\n"
        "`[code](c.md)`\n\n    [indented](c.md)\n```\n[fenced](c.md)\n```\n")
    assert broken_links("docs/a.md", str(tmp_path)) == [
        "docs/a.md:3: c.md: no such file",
        "docs/a.md:3: b.md#three-words: no heading with that anchor in docs/b.md"]
