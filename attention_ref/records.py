r"""Framework results run live where PyTorch or JAX is installed, and read from a record where it is not.

The book compares the package with PyTorch and JAX, yet Read the Docs and
``make docs`` install neither, and a page must read the same there.
`FrameworkRecord` runs a comparison live when every framework it needs can be
imported, and otherwise returns the results a live run stored, in a record
with one section per page (``docs/chapters/frameworks_record.json``).
Results are strict JSON values: finite numbers, strings, and lists and dicts
of them (no NaN: a notebook carries the record as a Python literal, where
``nan`` is not a name).

With the environment variable ``FRAMEWORKS_RECORD`` naming a file, a live run
writes its page's section there (`FrameworkRecord.save_if_requested`): that
renews the committed record, and ``tests/test_frameworks_record.py`` compares
such a run with it. The class lives in the package rather than beside the
pages because the pages' notebooks run wherever attention_ref is installed
(Colab, Binder), where the repository's ``docs/`` folder is not.

Examples
--------
>>> from attention_ref.records import FrameworkRecord
>>> recorded = {"demo": {"versions": {"no_such_framework": "1.0"}, "cases": {"sum": {"total": 3}}}}
>>> record = FrameworkRecord("demo", recorded, needs=("no_such_framework",))
>>> record.live
False
>>> record.take("sum", lambda: {"total": 1 + 2})   # not run: the framework is missing
{'total': 3}
>>> record.note()
'are recorded: computed with no_such_framework 1.0 on a machine that had it'
>>> from attention_ref.records import NOTE
>>> NOTE.fullmatch(record.note()) is not None
True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENVIRONMENT_VARIABLE", "NOTE", "FrameworkRecord", "same_to_rounding"]

#: Names a file for a live run to write its page's section to.
ENVIRONMENT_VARIABLE = "FRAMEWORKS_RECORD"
#: Either form of `FrameworkRecord.note` ("ran live ..." or "are recorded: ..."): the one text of a page that
#: differs between a build with the frameworks and one without (the book's notebook checks leave it out then).
NOTE = re.compile(r"ran live when this page was made, with .+?; a run without (?:it|them) takes the recorded "
                  r"results instead|are recorded: computed with .+? on a machine that had (?:it|them)")
#: A live result within this many float64 units of rounding (of the larger magnitude, at least 1) of the
#: recorded one is shown as recorded: the last bits of a float64 difference move with the machine's BLAS and
#: vector units, and a page must read the same on every machine and every channel.
ROUNDING_ULPS = 8
#: How the notes name each framework (by its import name).
DISPLAY_NAMES = {"torch": "PyTorch", "jax": "JAX", "transformers": "Hugging Face transformers"}


def _installed(name: str) -> bool:
    """Whether `name` can be imported (``find_spec`` also says no for a module set to None in sys.modules)."""
    return importlib.util.find_spec(name) is not None


def release_numbers(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: ``'2.13.0+cpu'`` -> ``(2, 13, 0)``, ``'5.0.0rc1'`` -> ``(5, 0, 0)``."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    if match is None:
        raise ValueError(f"a version must start with its release numbers, like '5.23' or '2.13.0+cpu'; got {version!r}")
    return tuple(int(part) for part in match.group().split("."))


def installed_version(name: str) -> str | None:
    """The installed version of the framework `name`: None if it cannot be imported, "" if it has no
    distribution metadata (a source tree on the path)."""
    if not _installed(name):
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _recent_enough(name: str, minimum: str | None) -> bool:
    """Whether the installed distribution `name` is at least version `minimum` (any version when None).

    An importable package without distribution metadata has no version to compare: it does not count as recent
    enough, and the page reads the record.
    """
    if minimum is None:
        return True
    version = installed_version(name)
    return version is not None and version != "" and release_numbers(version) >= release_numbers(minimum)


def same_to_rounding(recorded, live, precision: str = "float64") -> bool:
    """Whether `live` equals `recorded` up to the rounding of `precision` (`ROUNDING_ULPS`), value by value.

    Numbers compare by ``|a - b| <= ROUNDING_ULPS * eps * max(1, |a|, |b|)``, with `eps` the machine
    epsilon of `precision` ("float64" or "float32": a framework that computes in float32, as JAX's
    attention does, rounds differently on another CPU); strings, booleans and ``None`` exactly; lists and
    dicts entry by entry, with the same length and keys.

    >>> from attention_ref.records import same_to_rounding
    >>> same_to_rounding(1.7e-07, 1.2e-07), same_to_rounding(1.7e-07, 1.2e-07, precision="float32")
    (False, True)
    """
    if precision not in ("float64", "float32"):
        raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}")
    if isinstance(recorded, bool) or isinstance(live, bool) or recorded is None or live is None:
        return type(recorded) is type(live) and recorded == live
    if isinstance(recorded, (int, float)) and isinstance(live, (int, float)):
        a, b = float(recorded), float(live)
        eps = 2.0**-52 if precision == "float64" else 2.0**-23
        return abs(a - b) <= ROUNDING_ULPS * eps * max(1.0, abs(a), abs(b))
    if isinstance(recorded, Mapping) and isinstance(live, Mapping):
        return recorded.keys() == live.keys() and all(
            same_to_rounding(recorded[k], live[k], precision) for k in recorded)
    if isinstance(recorded, (list, tuple)) and isinstance(live, (list, tuple)):
        return len(recorded) == len(live) and all(
            same_to_rounding(a, b, precision) for a, b in zip(recorded, live, strict=True))
    return recorded == live


class FrameworkRecord:
    """One page's framework results: run live if every framework in `needs` is installed, else recorded.

    Parameters
    ----------
    page : str
        The page's section in the record.
    recorded : mapping
        The record's content (the parsed JSON file): ``{page: {"versions": ..., "cases": ...}}``.
    needs : iterable of str
        Import names of the frameworks the page's comparisons use, e.g. ``("torch", "jax")``.
    at_least : mapping of str to str, optional
        Oldest version of a framework in `needs` that the page's code runs with, e.g.
        ``{"transformers": "5.23"}``: an older installed one counts as missing (the page reads the record), as
        where a downloaded notebook runs with whatever version is installed. Release numbers are compared.

    Attributes
    ----------
    live : bool
        True when every framework in `needs` can be imported, at the versions `at_least` asks for.
    versions : dict
        The frameworks' versions (and NumPy's and the package's): installed ones when live, recorded ones otherwise.
    measured : dict
        The results of each case taken so far, by case name.
    """

    def __init__(self, page: str, recorded: Mapping[str, Any], needs: Iterable[str],
                 at_least: Mapping[str, str] | None = None):
        self.page = page
        self.needs = tuple(needs)
        if not self.needs:
            raise ValueError("needs must name at least one framework, got none")
        at_least = dict(at_least or {})
        if not at_least.keys() <= set(self.needs):
            raise ValueError(f"at_least names frameworks outside needs {list(self.needs)}: {sorted(at_least)}")
        for minimum in at_least.values():
            release_numbers(minimum)
        self.live = all(_installed(name) and _recent_enough(name, at_least.get(name)) for name in self.needs)
        self.measured: dict[str, Any] = {}
        self._cases: Mapping[str, Any] = recorded[page]["cases"] if page in recorded else {}
        if self.live:
            self.versions = {name: importlib.metadata.version(name) for name in (*self.needs, "numpy", "attention_ref")}
        else:
            if page not in recorded:
                raise ValueError(f"the record has no section for page {page!r}; it has {sorted(recorded)}")
            self.versions = dict(recorded[page]["versions"])

    def take(self, case: str, run: Callable[[], Any], precision: str = "float64") -> Any:
        """The results of `case`: ``run()`` when live, the recorded ones otherwise (kept in `measured` too).

        A live result equal to the recorded one up to the rounding of `precision` (`same_to_rounding`:
        "float64", or "float32" for a case where a framework computes in float32) is returned as recorded,
        so that the page reads the same on every machine; any other live result is returned as it came.
        """
        if self.live:
            result = run()
            recorded = self._cases.get(case)
            same = recorded is not None and same_to_rounding(recorded, result, precision)
            self.measured[case] = recorded if same else result
        elif case in self._cases:
            self.measured[case] = self._cases[case]
        else:
            raise ValueError(f"the record of page {self.page!r} has no case {case!r}; it has {sorted(self._cases)}")
        return self.measured[case]

    def frameworks(self) -> str:
        """The frameworks with their versions, as a note names them: ``'PyTorch 2.5.1 and JAX 0.4.35'``."""
        named = [f"{DISPLAY_NAMES.get(name, name)} {self.versions[name]}" for name in self.needs]
        return ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]

    def note(self) -> str:
        """How the results were obtained, to complete "The ... results on this page ...": live or recorded."""
        them = "them" if len(self.needs) > 1 else "it"
        if self.live:
            # True in the book and in a notebook downloaded from it, which may later run where a framework is
            # missing: the note describes the run that made the page, not the reader's.
            return (f"ran live when this page was made, with {self.frameworks()}; a run without {them} "
                    "takes the recorded results instead")
        return f"are recorded: computed with {self.frameworks()} on a machine that had {them}"

    def save_if_requested(self, environ: Mapping[str, str] = os.environ) -> Path | None:
        """Write this page's section into the file named by ``FRAMEWORKS_RECORD``, if set; return its path.

        The file's other pages' sections are kept. Only a live run can record, and only strict JSON (a NaN
        or infinity in the results is a ValueError: describe it in words).
        """
        target = environ.get(ENVIRONMENT_VARIABLE)
        if not target:
            return None
        if not self.live:
            raise RuntimeError(f"{ENVIRONMENT_VARIABLE} is set but {', '.join(self.needs)} cannot all be imported: "
                               "only a live run can record")
        path = Path(target)
        content = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and path.stat().st_size else {}
        content[self.page] = {"versions": self.versions, "cases": self.measured}
        try:
            text = json.dumps(content, indent=1, allow_nan=False)
        except ValueError as exc:
            raise ValueError(f"the results of page {self.page!r} must be strict JSON ({exc}): "
                             f"describe a NaN or infinity in words, got {self.measured!r}") from None
        path.write_text(text + "\n", encoding="utf-8")
        return path
