"""The declared public API: every name of ``rollgym.__all__`` resolves from its home, and
docs/reference/api.md lists exactly those names, each under its home (``_HOMES``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import rollgym

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "api.md"
PUBLIC = sorted(name for name in rollgym.__all__ if name != "__version__")


def test_every_public_name_is_its_homes_object() -> None:
    assert sorted(set(rollgym.__all__)) == sorted(rollgym.__all__)
    assert sorted(rollgym._HOMES) == PUBLIC
    for name in PUBLIC:
        home = importlib.import_module(rollgym._HOMES[name])
        assert getattr(rollgym, name) is getattr(home, name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(rollgym, "collect_sync")
    assert "RolloutClient" in dir(rollgym)


def test_the_api_page_lists_exactly_the_public_names() -> None:
    page = API_PAGE.read_text(encoding="utf-8")
    intro = re.search(r"`import rollgym` gives exactly these names.*?: (.*?)\.\n", page, re.S)
    assert intro is not None
    assert sorted(re.findall(r"`rollgym\.(\w+)`", intro.group(1))) == PUBLIC
    homes = set(rollgym._HOMES.values())
    documented, home = set(), ""
    for line in page.splitlines():
        if found := re.fullmatch(r"### `([\w.]+)`", line):
            home = found.group(1)
        elif (found := re.fullmatch(r"#### `(\w+)`", line)) and home in homes:
            documented.add((found.group(1), home))
    assert documented == set(rollgym._HOMES.items())
