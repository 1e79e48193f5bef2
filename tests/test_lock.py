"""The committed lock (requirements/*.txt) pins what the Makefile installs, agrees with pyproject.toml, and is used.

A release of any dependency must not change what ``make docs``, ``make serve`` or ``make test`` install: each
install takes the exact versions, transitive ones included, from a constraints file that ``make lock`` writes with
``uv pip compile`` (``make upgrade-deps`` moves them all, in a commit of its own). These tests fail when
pyproject.toml gains a requirement the lock does not pin, when a pin falls outside pyproject's range, when the
three lock files disagree on a package they share, when the Makefile installs without the lock, or when the
environment the tests run in holds another version than the one pinned.
"""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements"
# Which extras each lock file pins, as the Makefile's `lock` target compiles them.
SETS = {"docs.txt": ["docs"], "live.txt": ["docs", "live"], "test.txt": ["test", "docs", "browser", "live"]}


def pins(name):
    """{canonical name: [(version, marker or '')]} of one lock file (a package may be pinned once per marker)."""
    from packaging.utils import canonicalize_name

    found = {}
    for line in (LOCK / name).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;\s*(.*))?$", line)
        if match:
            found.setdefault(canonicalize_name(match[1]), []).append((match[2], match[3] or ""))
    return found


def requirements_of(extras):
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]
    return [Requirement(r) for r in listed]


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_requirement_is_pinned_within_its_range(name):
    require("packaging")
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    locked = pins(name)
    assert len(locked) > 20, f"{name} pins only {len(locked)} packages"
    for requirement in requirements_of(SETS[name]):
        versions = locked.get(canonicalize_name(requirement.name))
        assert versions, f"{name} does not pin {requirement.name}: run `make lock`"
        for version, _ in versions:
            assert requirement.specifier.contains(Version(version), prereleases=True), (
                f"{name} pins {requirement.name}=={version}, outside pyproject's {requirement}: run `make lock`")


def here(name):
    """{package: version} that one lock file pins for this interpreter (its environment markers evaluated)."""
    from packaging.markers import Marker

    return {package: version for package, versions in pins(name).items()
            for version, marker in versions if not marker or Marker(marker).evaluate()}


def test_the_three_locks_agree_on_what_they_share():
    """For this interpreter: otherwise `make docs` and `make test` would install one package at two versions in
    turn (a universal file forks on Python's patch release; test.txt is resolved for this venv's Python)."""
    require("packaging")
    docs, live, test = (here(name) for name in ("docs.txt", "live.txt", "test.txt"))
    for smaller, larger, label in ((docs, live, "docs/live"), (live, test, "live/test")):
        differ = {p: (v, larger[p]) for p, v in smaller.items() if p in larger and larger[p] != v}
        assert not differ, f"{label} disagree: {differ}"


def test_the_makefile_and_hosted_builds_install_from_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    for extras, lock in (("'.[docs]'", "docs"), ("'.[docs,live]'", "live"), ("'.[test,docs,browser,live]'", "test")):
        (line,) = [line for line in makefile.splitlines() if f"$(PIP) -e {extras}" in line]
        assert f"-c $(LOCK)/{lock}.txt" in line, line
    assert "-r $(LOCK)/tools.txt" in makefile
    assert "-c requirements/docs.txt" in (ROOT / "binder" / "postBuild").read_text()
    assert "requirements: requirements/docs.txt" in (ROOT / ".readthedocs.yaml").read_text()
    # The lock records the pinned PyTorch that the Makefile installs.
    torch = re.search(r"^TORCH \?= torch==(\S+)$", makefile, re.M)[1]
    assert [v.split("+")[0] for v, _ in pins("test.txt")["torch"]] == [torch]


def test_this_environment_holds_the_pinned_versions():
    """The tests run with what the lock pins: every pinned package that is installed has the pinned version."""
    require("packaging")
    from packaging.utils import canonicalize_name

    locked = pins("test.txt")
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    checked, wrong = 0, []
    for package, versions in locked.items():
        if package in installed:
            checked += 1
            if installed[package] not in {v for v, _ in versions}:
                wrong.append(f"{package} {installed[package]} (lock: {versions[0][0]})")
    assert checked > 100, f"only {checked} pinned packages are installed: is this the project's environment?"
    assert not wrong, "installed versions differ from requirements/test.txt: " + ", ".join(wrong)
