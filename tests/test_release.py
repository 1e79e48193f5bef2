"""One version everywhere: pyproject.toml, attention_ref.__version__, CHANGELOG.md's newest section and CITATION.cff;
and the licence that pyproject.toml declares is the one in LICENSE.

A suite that pins attention_ref to a version relies on CHANGELOG.md naming every change of the public API, so a
version bump without its section (or a section without the bump) fails here.
"""

import re
import tomllib
from pathlib import Path

import attention_ref

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# A release heading: "## 0.2.0 - 2026-11-27".
HEADING = re.compile(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def releases():
    """[(version, date)] of CHANGELOG.md's release sections, newest first as written."""
    return HEADING.findall((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))


def citation():
    """CITATION.cff as a dict: parsed as YAML when PyYAML is installed, else its top-level ``key: value`` lines."""
    text = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:
        return {m[1]: m[2].strip().strip("\"'") for m in re.finditer(r"^([a-z-]+):[ \t]*(\S.*)$", text, re.M)}
    return {key: str(value) if key == "date-released" else value for key, value in yaml.safe_load(text).items()}


def test_the_package_has_the_version_of_pyproject():
    assert attention_ref.__version__ == PROJECT["version"]


def test_the_changelog_opens_with_this_version_and_lists_each_version_once():
    versions = [version for version, _ in releases()]
    assert versions, "CHANGELOG.md has no section headed '## X.Y.Z - YYYY-MM-DD'"
    assert versions[0] == attention_ref.__version__, f"CHANGELOG.md's newest section is {versions[0]}"
    assert len(set(versions)) == len(versions), versions
    as_numbers = [tuple(int(part) for part in version.split(".")) for version in versions]
    assert as_numbers == sorted(as_numbers, reverse=True), versions  # newest first


def test_the_changelog_states_the_versioning_policy():
    preamble = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    for needed in ("public API", "__all__", "defaults", "conventions", "same verdicts"):
        assert needed in preamble, f"CHANGELOG.md's opening lacks {needed!r}"


def test_the_licence_is_bsd_3_clause_and_ships():
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert licence.startswith("BSD 3-Clause License\n"), licence[:80]
    assert "Copyright (c) 2026, The attention_ref developers" in licence
    assert "Neither the name of the copyright holder nor the names of its" in licence  # the third clause
    assert PROJECT["license"] == "BSD-3-Clause"
    assert PROJECT["license-files"] == ["LICENSE"]


def test_the_citation_names_this_release():
    cff = citation()
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == attention_ref.__version__
    assert cff["license"] == PROJECT["license"]
    assert cff["title"].startswith("attention_ref")
    assert "message" in cff
    newest_date = releases()[0][1]
    assert cff["date-released"] == newest_date, "CITATION.cff and CHANGELOG.md date the release differently"
