"""
CHANGELOG.md stays a changelog for people (issue #57): each entry says what changed for a user and
what to do in at most two sentences of about 60 words, the sections come in the house order, and the
whole file stays short enough to read in five minutes. Details belong in the docs.
"""

from __future__ import annotations

import re
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
#: The whole file stays under this many characters.
MOST_CHARACTERS = 15_000
#: The most words of one entry, its issue links and code names included ("about 60").
MOST_WORDS = 70
#: Keep a Changelog's sections, in the order STYLE.md gives.
SECTIONS = ["Security", "Removed", "Deprecated", "Added", "Changed", "Fixed"]
#: A sentence's end: a stop, then a space and a capital or a backquote (not "e.g. the").
_SENTENCE_END = re.compile(r"[.!?] +(?=[A-Z`])")


def _entries(text: str) -> list[str]:
    """Every bullet entry, its continuation lines joined."""
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            entries.append(line[2:])
        elif entries and line.startswith("  ") and line.strip():
            entries[-1] += " " + line.strip()
    return entries


def test_the_changelog_is_short() -> None:
    assert len(CHANGELOG.read_text(encoding="utf-8")) < MOST_CHARACTERS


def test_each_entry_says_it_in_two_sentences() -> None:
    """At most two sentences and about 60 words, ending with its issue link where it has one."""
    long = []
    for entry in _entries(CHANGELOG.read_text(encoding="utf-8")):
        words = len(entry.split())
        sentences = len(_SENTENCE_END.findall(entry)) + 1
        if words > MOST_WORDS or sentences > 2:
            long.append(f"{words} words, {sentences} sentences: {entry[:80]}...")
    assert long == []


def test_the_sections_of_each_release_come_in_the_house_order() -> None:
    releases = re.split(r"(?m)^## ", CHANGELOG.read_text(encoding="utf-8"))[1:]
    assert releases, "no release"
    for release in releases:
        found = re.findall(r"(?m)^### (\w+)", release)
        assert all(name in SECTIONS for name in found), found
        assert found == sorted(found, key=SECTIONS.index), release.splitlines()[0]
