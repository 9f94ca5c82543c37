"""The docs name every option, flag and warning code the code has, and the README's commands exist."""

from __future__ import annotations

import re

from rayito_constructs.project import OPTION_TABLE

from .conftest import ROOT


def test_options_doc_lists_every_option_and_flag() -> None:
    text = (ROOT / "docs" / "options.md").read_text()
    for key, (_, flag) in OPTION_TABLE.items():
        assert flag in text, flag
        if key not in {"allow_out"}:
            assert key in text, key


def test_warning_codes_are_documented() -> None:
    codes = set()
    for path in (ROOT / "rayito_constructs").glob("*.py"):
        codes |= set(re.findall(r'FleetWarning\(\s*"([a-z_]+)"', path.read_text()))
    codes |= {"recipe_too_large", "recipe_unreadable"}
    docs = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert codes and all(code in docs for code in codes), codes


def test_readme_starts_with_the_two_commands() -> None:
    lines = [l for l in (ROOT / "README.md").read_text().splitlines() if l.strip()]
    assert lines[1] == "```sh"
    assert lines[2].startswith("make synth ") and lines[3].startswith("make test ")
    assert lines[4] == "```"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^synth:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
