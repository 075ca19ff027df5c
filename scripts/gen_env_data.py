"""Generate the example task files of the bundled environments, deterministically.

    python scripts/gen_env_data.py           # write src/rollgym/envs/*/data/example.jsonl
    python scripts/gen_env_data.py --check   # exit 1 if a committed file is out of date

Rows are in NeMo Gym's format. ``responses_create_params.metadata.rollgym_script`` drives
rollgym's scripted model (a deterministic stand-in for an LLM, not a language model): a JSON list
of turns, each ``{"call": ...}``, ``{"calls": [...]}`` or ``{"say": [alternatives]}``. The last
turn's alternatives mix right and wrong answers so that rewards vary across repeats; each
generated task also records which alternatives should earn reward 1 (``Generated.rewarded``),
which the tests check against the real verifiers.

The questions, the registry and every answer here were written for rollgym.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollgym.envs.lookup.knowledge import PRODUCTS, TOWNS
from rollgym.envs.lookup.server import LookupEnv

ENVS_DIR = Path(__file__).resolve().parent.parent / "src" / "rollgym" / "envs"
# OpenAI caps metadata values at 512 characters; keep rows usable against a real endpoint.
MAX_SCRIPT_CHARS = 512


@dataclass(frozen=True)
class Generated:
    row: dict[str, Any]
    rewarded: list[bool]  # per alternative of the final "say" turn: should it earn reward 1?


def _row(prompt: str, script: list[dict[str, Any]], expected: str, **fields: Any) -> dict[str, Any]:
    text = json.dumps(script, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_SCRIPT_CHARS:
        raise ValueError(f"script of {len(text)} chars exceeds {MAX_SCRIPT_CHARS}: {prompt!r}")
    params: dict[str, Any] = {"input": [{"role": "user", "content": prompt}]}
    if "tools" in fields:
        params["tools"] = fields.pop("tools")
    params["metadata"] = {"rollgym_script": text}
    return {"responses_create_params": params, "expected_answer": expected, **fields}


def _mix(rng: random.Random, right: list[str], wrong: list[str]) -> list[tuple[str, bool]]:
    """Three or four alternatives: one to three right ones, the rest wrong, shuffled."""
    n_right = min(len(right), rng.choice([1, 2, 2, 3, 3]))
    n_wrong = min(len(wrong), rng.choice([1, 1, 2]) if n_right < 3 else 1)
    picked = [(t, True) for t in rng.sample(right, n_right)]
    picked += [(t, False) for t in rng.sample(wrong, n_wrong)]
    rng.shuffle(picked)
    return picked


def _say(alternatives: list[tuple[str, bool]]) -> dict[str, Any]:
    return {"say": [text for text, _ in alternatives]}


# -- lookup ----------------------------------------------------------------------------------

_TOWN_FIELDS = {
    "population": (
        "How many people live in {key}?",
        [
            "The registry lists {key} with a population of {v:,}.",
            "{key} has {v} residents.",
            "Registry entry: {tool_output}. So {key} has {v} inhabitants.",
        ],
        ["{key} has a population of {w:,}.", "I could not find how many people live in {key}."],
    ),
    "founded": (
        "In what year was {key} founded?",
        [
            "{key} was founded in {v}.",
            "According to the registry: {v}.",
            "The entry says {tool_output}, so the answer is {v}.",
        ],
        ["{key} was founded in {w}.", "The registry entry does not give a founding year."],
    ),
    "mayor": (
        "Who is the mayor of {key}?",
        [
            "The mayor of {key} is {v}.",
            "{v} is the mayor.",
            "Per the registry ({tool_output}): {v}.",
        ],
        ["The mayor of {key} is {w}.", "{key} has no mayor listed."],
    ),
    "region": (
        "Which region is {key} in?",
        ["{key} lies in {v}.", "It is in the {v} region.", "From {tool_output}: {v}."],
        ["{key} lies in {w}.", "It is a town in Norrowvale."],
    ),
}
_PRODUCT_FIELDS = {
    "price_eur": (
        "What does the item with product code {key} cost, in euros?",
        ["{key} costs €{v}.", "The price is {v} euros.", "Registry: {tool_output}. Price: €{v}."],
        ["{key} costs €{w}.", "The price is not listed."],
    ),
    "stock": (
        "How many units of product {key} are in stock?",
        [
            "There are {v} units of {key} in stock.",
            "Stock: {v}.",
            "{tool_output} shows {v} in stock.",
        ],
        ["There are {w} units in stock.", "It is out of stock."],
    ),
    "product": (
        "Which product has the code {key}?",
        ["{key} is the {v}.", "That code belongs to the {v}.", "Lookup result {tool_output}: {v}."],
        ["{key} is the {w}.", "That code is not a product."],
    ),
}
_TOWN_QUESTIONS = [
    ("Brackenholt", "population"),
    ("Velmora", "founded"),
    ("Ashgrove Ferry", "mayor"),
    ("Duncaster", "population"),
    ("Kestrel Point", "region"),
    ("Orrin's Reach", "founded"),
    ("Tallowmere", "mayor"),
    ("Quillon", "population"),
    ("Serrowby", "region"),
    ("Mirefield", "founded"),
]
_PRODUCT_QUESTIONS = [
    ("QX-4471", "price_eur"),
    ("BR-0925", "stock"),
    ("LM-3310", "product"),
    ("ZT-7802", "price_eur"),
    ("KP-1567", "stock"),
    ("HV-6024", "product"),
]
_LOOKUP_PREAMBLE = "Use the lookup tool to consult the Norrowvale registry, then answer.\n\n"


def _other(rng: random.Random, table: dict[str, dict[str, Any]], key: str, field: str) -> Any:
    values = sorted(
        {str(r[field]) for k, r in table.items() if k != key} - {str(table[key][field])}
    )
    value = rng.choice(values)
    return int(value) if value.isdigit() else value


def _field_task(
    rng: random.Random,
    table: dict[str, dict[str, Any]],
    key: str,
    field: str,
    templates: tuple[str, list[str], list[str]],
    tools: list[dict[str, Any]],
) -> Generated:
    question, right, wrong = templates
    v, w = table[key][field], _other(rng, table, key, field)
    fill = {"key": key, "v": v, "w": w}
    alternatives = _mix(
        rng,
        [t.format(**fill, tool_output="{tool_output}") for t in right],
        [t.format(**fill) for t in wrong],
    )
    script = [{"call": "lookup", "arguments": {"key": key}}, _say(alternatives)]
    row = _row(_LOOKUP_PREAMBLE + question.format(key=key), script, str(v), tools=tools)
    return Generated(row, [ok for _, ok in alternatives])


def build_lookup() -> list[Generated]:
    rng = random.Random("rollgym-lookup")
    tools = [spec.schema() for spec in LookupEnv.tools.values()]
    out = [_field_task(rng, TOWNS, k, f, _TOWN_FIELDS[f], tools) for k, f in _TOWN_QUESTIONS]
    out += [
        _field_task(rng, PRODUCTS, k, f, _PRODUCT_FIELDS[f], tools) for k, f in _PRODUCT_QUESTIONS
    ]

    # Two lookups: product -> its warehouse town -> a field of that town.
    for code, field, question in [
        ("QX-4471", "region", "In which region is the warehouse that stocks {code}?"),
        ("LM-3310", "mayor", "Who is the mayor of the town where {code} is warehoused?"),
        ("HV-6024", "region", "Which region ships product {code}?"),
    ]:
        town = PRODUCTS[code]["warehouse"]
        v, w = TOWNS[town][field], _other(rng, TOWNS, town, field)
        alternatives = _mix(
            rng,
            [
                f"{code} is stocked in {town}; {{tool_output}} gives {v}.",
                f"The warehouse is in {town}, so the answer is {v}.",
                f"{v}.",
            ],
            [f"The warehouse is in {town}, so the answer is {w}.", f"It is stocked in {town}."],
        )
        script = [
            {"call": "lookup", "arguments": {"key": code}},
            {"call": "lookup", "arguments": {"key": town}},
            _say(alternatives),
        ]
        prompt = _LOOKUP_PREAMBLE + question.format(code=code)
        out.append(
            Generated(_row(prompt, script, str(v), tools=tools), [ok for _, ok in alternatives])
        )

    # Two lookups in one turn, then a comparison; only the chosen town is named.
    for a, b in [("Velmora", "Serrowby"), ("Quillon", "Duncaster"), ("Mirefield", "Tallowmere")]:
        big, small = sorted((a, b), key=lambda t: -TOWNS[t]["population"])
        alternatives = _mix(
            rng,
            [
                f"{big} is larger, with {TOWNS[big]['population']:,} residents.",
                f"{big} has more inhabitants.",
                f"More people live in {big}.",
            ],
            [f"{small} is larger.", f"{small} has more inhabitants."],
        )
        script = [
            {"calls": [{"name": "lookup", "arguments": {"key": t}} for t in (a, b)]},
            _say(alternatives),
        ]
        prompt = _LOOKUP_PREAMBLE + f"Which town has more inhabitants, {a} or {b}?"
        out.append(
            Generated(_row(prompt, script, big, tools=tools), [ok for _, ok in alternatives])
        )

    # A misspelled key answers 404 (with a suggestion); the script recovers with the right key.
    for typo, key, field in [
        ("Velmorra", "Velmora", "mayor"),
        ("kestrel pt", "Kestrel Point", "population"),
    ]:
        v = TOWNS[key][field]
        alternatives = [
            (f"The registry spells it {key}; the answer is {v}.", True),
            (f"{v}.", True),
            (f"I could not find {typo} in the registry.", False),
        ]
        script = [
            {"call": "lookup", "arguments": {"key": typo}},
            {"call": "lookup", "arguments": {"key": key}},
            _say(alternatives),
        ]
        question = _TOWN_FIELDS[field][0].format(key=typo)
        out.append(
            Generated(
                _row(_LOOKUP_PREAMBLE + question, script, str(v), tools=tools),
                [ok for _, ok in alternatives],
            )
        )

    # No tool call at all: even a right number earns nothing (the registry is fictional).
    for key in ("Brackenholt", "Duncaster"):
        v = TOWNS[key]["founded"]
        alternatives = [
            (f"{key} was founded in {v}.", False),
            (f"I believe {key} dates from 1700.", False),
        ]
        question = _TOWN_FIELDS["founded"][0].format(key=key)
        out.append(
            Generated(
                _row(_LOOKUP_PREAMBLE + question, [_say(alternatives)], str(v), tools=tools),
                [ok for _, ok in alternatives],
            )
        )
    return out


# -- mcqa ------------------------------------------------------------------------------------

_MCQA_QUESTIONS: list[tuple[str, str, list[str]]] = [
    ("Which planet has the shortest year?", "Mercury", ["Venus", "Mars", "Jupiter"]),
    ("What is the chemical symbol for sodium?", "Na", ["So", "Sd", "S"]),
    ("How many sides does a hexagon have?", "6", ["5", "7", "8"]),
    (
        "Which gas do plants take in for photosynthesis?",
        "Carbon dioxide",
        ["Oxygen", "Nitrogen", "Helium"],
    ),
    (
        "What is the boiling point of water at sea level, in degrees Celsius?",
        "100",
        ["90", "110", "212"],
    ),
    ("Which data structure serves items first-in, first-out?", "Queue", ["Stack", "Heap", "Trie"]),
    ("What is 15% of 200?", "30", ["15", "20", "35"]),
    ("Which organ pumps blood through the body?", "Heart", ["Liver", "Lung", "Kidney"]),
    (
        "What does HTTP status 404 mean?",
        "Not Found",
        ["Forbidden", "Bad Gateway", "Too Many Requests"],
    ),
    (
        "Which layer of the atmosphere do we live in?",
        "Troposphere",
        ["Stratosphere", "Mesosphere", "Thermosphere"],
    ),
    ("What is the largest prime number below 30?", "29", ["27", "23", "31"]),
    (
        "Which sorting algorithm has worst-case O(n log n) time?",
        "Merge sort",
        ["Quicksort", "Bubble sort", "Insertion sort"],
    ),
    ("How many bits are in a byte?", "8", ["4", "16", "10"]),
    ("Which metal is liquid at room temperature?", "Mercury", ["Iron", "Copper", "Aluminium"]),
    ("What is the square root of 169?", "13", ["12", "14", "16"]),
    (
        "Which blood cells carry oxygen?",
        "Red blood cells",
        ["White blood cells", "Platelets", "Plasma cells"],
    ),
    ("Which number is written as XL in Roman numerals?", "40", ["60", "90", "14"]),
    ("What is the freezing point of water in degrees Fahrenheit?", "32", ["0", "100", "-40"]),
    (
        "Which shape has every point the same distance from its centre?",
        "Circle",
        ["Ellipse", "Square", "Parabola"],
    ),
    ("How many minutes are in three hours?", "180", ["120", "160", "300"]),
    (
        "Which part of a cell holds its DNA in animals?",
        "Nucleus",
        ["Ribosome", "Membrane", "Vacuole"],
    ),
    ("What is the value of 2 to the power of 5?", "32", ["10", "25", "64"]),
    (
        "Which instrument measures air pressure?",
        "Barometer",
        ["Thermometer", "Hygrometer", "Anemometer"],
    ),
    (
        "Which force keeps planets in orbit around the Sun?",
        "Gravity",
        ["Magnetism", "Friction", "Buoyancy"],
    ),
]
_MCQA_RIGHT = [
    "Let me check each option. \\boxed{{{x}}}",
    "The answer is \\boxed{{\\text{{{x}}}}}.",
    "Answer: {x}",
    "**Answer:** {x}",
    "{text} is correct, so the answer is ({x}).",
    "{x}",
    "answer: {xl}",
    "My first thought was {y}, but that is wrong.\nFinal answer: {x}",
    "I'd go with {x}) {text}.",
]
_MCQA_WRONG = [
    "\\boxed{{{y}}}",
    "Answer: {y}",
    "It is either {x} or {y}.",
    "I am not sure about this one.",
    "The answer is ({y}).",
]
_MCQA_INSTRUCTIONS = [
    "Answer the multiple-choice question. Give the letter of your choice in \\boxed{}.",
    "Choose the correct option and reply with its letter.",
    "Pick one option. End your reply with 'Answer: <letter>'.",
]


def build_mcqa() -> list[Generated]:
    rng = random.Random("rollgym-mcqa")
    out = []
    for i, (question, answer, distractors) in enumerate(_MCQA_QUESTIONS):
        options = [answer, *distractors]
        rng.shuffle(options)
        letters = string.ascii_uppercase[: len(options)]
        x = letters[options.index(answer)]
        y = rng.choice([letter for letter in letters if letter != x])
        fill = {"x": x, "xl": x.lower(), "y": y, "text": answer}
        alternatives = _mix(
            rng, [t.format(**fill) for t in _MCQA_RIGHT], [t.format(**fill) for t in _MCQA_WRONG]
        )
        listing = "\n".join(
            f"{letter}) {text}" for letter, text in zip(letters, options, strict=True)
        )
        prompt = f"{_MCQA_INSTRUCTIONS[i % len(_MCQA_INSTRUCTIONS)]}\n\n{question}\n\n{listing}"
        # Both forms of 'options' occur: a dict letter -> text, or a plain list.
        opts: dict[str, str] | list[str] = (
            dict(zip(letters, options, strict=True)) if i % 2 == 0 else options
        )
        row = _row(prompt, [_say(alternatives)], x, options=opts)
        out.append(Generated(row, [ok for _, ok in alternatives]))
    return out


# -- math ------------------------------------------------------------------------------------

# (question, expected_answer, equivalent right forms, wrong forms)
_MATH_PROBLEMS: list[tuple[str, str, list[str], list[str]]] = [
    (
        "Compute $\\frac{3}{4} + \\frac{1}{8}$.",
        "\\frac{7}{8}",
        ["\\frac{7}{8}", "0.875", "\\frac{14}{16}"],
        ["\\frac{4}{12}", "\\frac{1}{2}"],
    ),
    (
        "What is $\\sin(\\pi/6)$?",
        "\\frac{1}{2}",
        ["\\frac{1}{2}", "0.5", "1/2"],
        ["\\frac{\\sqrt{3}}{2}", "1"],
    ),
    (
        "Simplify $\\sqrt{72}$.",
        "6\\sqrt{2}",
        ["6\\sqrt{2}", "\\sqrt{2} \\cdot 6"],
        ["8\\sqrt{2}", "36\\sqrt{2}"],
    ),
    ("Solve $2x + 5 = 17$ for $x$.", "6", ["x = 6", "6"], ["11", "x = 8"]),
    (
        "What is the sum of the integers from 1 to 100?",
        "5050",
        ["5050", "5,050"],
        ["5000", "10100"],
    ),
    (
        "Expand $(x+3)^2$.",
        "x^2+6x+9",
        ["x^2 + 6x + 9", "9 + 6x + x^2"],
        ["x^2 + 9", "x^2 + 3x + 9"],
    ),
    (
        "What is the area of a circle of radius 3?",
        "9\\pi",
        ["9\\pi", "28.274334"],
        ["6\\pi", "3\\pi"],
    ),
    (
        "Two fair coins are tossed. What is the probability that both land heads?",
        "\\frac{1}{4}",
        ["\\frac{1}{4}", "0.25", "1/4"],
        ["\\frac{1}{2}", "\\frac{1}{3}"],
    ),
    ("What is the greatest common divisor of 84 and 120?", "12", ["12"], ["6", "24"]),
    ("What is the least common multiple of 6 and 8?", "24", ["24"], ["48", "2"]),
    ("Evaluate $\\log_2 64$.", "6", ["6", "6.0"], ["8", "32"]),
    ("What is the derivative of $x^3$ at $x = 2$?", "12", ["12"], ["8", "6"]),
    ("Evaluate $\\int_0^1 2x \\, dx$.", "1", ["1", "1.0"], ["2", "\\frac{1}{2}"]),
    (
        "A right triangle has legs 5 and 12. How long is its hypotenuse?",
        "13",
        ["13", "\\sqrt{169}"],
        ["17", "\\sqrt{119}"],
    ),
    (
        "Compute $\\frac{2/3}{4/9}$.",
        "\\frac{3}{2}",
        ["\\frac{3}{2}", "1.5", "3/2"],
        ["\\frac{8}{27}", "\\frac{2}{3}"],
    ),
    ("Compute $7!/5!$.", "42", ["42"], ["2", "35"]),
    (
        "In how many ways can 2 people be chosen from 6?",
        "15",
        ["15", "\\binom{6}{2}"],
        ["30", "12"],
    ),
    (
        "What is the slope of the line through $(1, 2)$ and $(3, 8)$?",
        "3",
        ["3", "\\frac{6}{2}"],
        ["\\frac{1}{3}", "6"],
    ),
    ("Solve $3x - 7 = 2x + 4$ for $x$.", "11", ["x = 11", "11"], ["-3", "3"]),
    ("What is the mean of 4, 8, 15, 16, 23 and 42?", "18", ["18", "18.0"], ["15.5", "16"]),
    ("What is $2^{10}$?", "1024", ["1024", "1,024"], ["1000", "2048"]),
    ("Simplify $\\frac{x^2-1}{x-1}$ for $x \\neq 1$.", "x+1", ["x + 1", "1 + x"], ["x - 1", "x^2"]),
    (
        "Find both roots of $x^2 - 5x + 6 = 0$, separated by a comma.",
        "2, 3",
        ["2, 3", "3, 2"],
        ["-2, -3", "5, 6"],
    ),
    (
        "Write the solution set of $x^2 < 4$ as an interval.",
        "(-2, 2)",
        ["(-2, 2)"],
        ["[-2, 2]", "(-4, 4)"],
    ),
    (
        "Write $0.1 + 0.2$ as a fraction in lowest terms.",
        "\\frac{3}{10}",
        ["\\frac{3}{10}", "0.3"],
        ["\\frac{1}{5}", "\\frac{3}{100}"],
    ),
]
_MATH_WRAPPERS = [
    "Working step by step, the result is $\\boxed{{{f}}}$.",
    "So the answer is $\\boxed{{{f}}}$.",
    "Final answer: $\\boxed{{{f}}}$",
]
_NO_ANSWER = "I need more time to solve this."


def build_math() -> list[Generated]:
    rng = random.Random("rollgym-math")
    out = []
    for question, expected, right, wrong in _MATH_PROBLEMS:
        wrong_texts = [rng.choice(_MATH_WRAPPERS).format(f=f) for f in wrong]
        alternatives = _mix(
            rng,
            [rng.choice(_MATH_WRAPPERS).format(f=f) for f in right],
            [*wrong_texts, _NO_ANSWER],
        )
        prompt = f"{question} Put your final answer in \\boxed{{}}."
        out.append(
            Generated(_row(prompt, [_say(alternatives)], expected), [ok for _, ok in alternatives])
        )
    return out


# -- files -----------------------------------------------------------------------------------

BUILDERS = {"lookup": build_lookup, "mcqa": build_mcqa, "math": build_math}


def render(tasks: list[Generated]) -> str:
    return "".join(json.dumps(t.row, ensure_ascii=False) + "\n" for t in tasks)


def data_path(env: str) -> Path:
    return ENVS_DIR / env / "data" / "example.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the files are current")
    args = parser.parse_args(argv)
    stale = []
    for env, build in BUILDERS.items():
        tasks = build()
        text, path = render(tasks), data_path(env)
        mean = sum(sum(t.rewarded) / len(t.rewarded) for t in tasks) / len(tasks)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"{path}: {len(tasks)} tasks, expected mean reward {mean:.2f}")
    if stale:
        print(
            "out of date (run scripts/gen_env_data.py):\n  " + "\n  ".join(stale), file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
