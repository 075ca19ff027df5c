"""The Norrowvale registry: a small, entirely fictional knowledge base.

Every name and number here was made up for rollgym, so a model cannot know them and has to call
the ``lookup`` tool. Keys are town names and product codes; a product's ``warehouse`` is a town,
so some questions take two lookups.
"""

from __future__ import annotations

from typing import Any

TOWNS: dict[str, dict[str, Any]] = {
    "Brackenholt": {
        "region": "Eastmarch",
        "population": 48213,
        "founded": 1742,
        "mayor": "Ilse Marrow",
    },
    "Velmora": {
        "region": "Saltreach",
        "population": 9317,
        "founded": 1608,
        "mayor": "Teodor Quill",
    },
    "Ashgrove Ferry": {
        "region": "Eastmarch",
        "population": 2764,
        "founded": 1821,
        "mayor": "Petra Vand",
    },
    "Duncaster": {
        "region": "Highfold",
        "population": 130552,
        "founded": 1519,
        "mayor": "Oren Blakely",
    },
    "Kestrel Point": {
        "region": "Saltreach",
        "population": 15870,
        "founded": 1779,
        "mayor": "Mira Solberg",
    },
    "Orrin's Reach": {
        "region": "Highfold",
        "population": 6041,
        "founded": 1693,
        "mayor": "Caspar Wynd",
    },
    "Tallowmere": {
        "region": "Fenmoor",
        "population": 22489,
        "founded": 1650,
        "mayor": "Agnes Pellow",
    },
    "Quillon": {"region": "Fenmoor", "population": 71006, "founded": 1587, "mayor": "Lucan Trevis"},
    "Serrowby": {
        "region": "Eastmarch",
        "population": 3958,
        "founded": 1864,
        "mayor": "Hedda Krall",
    },
    "Mirefield": {
        "region": "Fenmoor",
        "population": 11327,
        "founded": 1711,
        "mayor": "Tobias Renn",
    },
}

PRODUCTS: dict[str, dict[str, Any]] = {
    "QX-4471": {
        "product": "Helio desk lamp",
        "price_eur": 37,
        "stock": 112,
        "warehouse": "Brackenholt",
    },
    "BR-0925": {
        "product": "Tidewater kettle",
        "price_eur": 54,
        "stock": 8,
        "warehouse": "Kestrel Point",
    },
    "LM-3310": {
        "product": "Fernline rucksack",
        "price_eur": 89,
        "stock": 46,
        "warehouse": "Quillon",
    },
    "ZT-7802": {
        "product": "Corvid bicycle bell",
        "price_eur": 12,
        "stock": 390,
        "warehouse": "Duncaster",
    },
    "KP-1567": {
        "product": "Marrow wool blanket",
        "price_eur": 141,
        "stock": 23,
        "warehouse": "Tallowmere",
    },
    "HV-6024": {
        "product": "Sparrow pocket radio",
        "price_eur": 63,
        "stock": 71,
        "warehouse": "Velmora",
    },
}


def _entries() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for name, fields in TOWNS.items():
        entries[name] = {"key": name, "kind": "town", **fields}
    for code, fields in PRODUCTS.items():
        entries[code] = {"key": code, "kind": "product", **fields}
    return entries


ENTRIES: dict[str, dict[str, Any]] = _entries()
"""Every entry by its canonical key."""

_BY_FOLDED: dict[str, str] = {key.casefold(): key for key in ENTRIES}


def canonical_key(key: str) -> str | None:
    """The registry key matching ``key`` (case and surrounding space ignored), or None."""
    return _BY_FOLDED.get(" ".join(key.split()).casefold())
