"""The report's hardest tasks show what each task asked: its first user message, cut short and
escaped (a prompt is data from anywhere, and the page is HTML)."""

from __future__ import annotations

import asyncio
import html
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.report import write_report
from rollgym.report.prompts import EXCERPT, excerpt, first_user_text, prompt_excerpts
from tests.report.runs import collect
from tests.support.stack import SOME_RIGHT, running_stack, task_row

pytestmark = pytest.mark.timeout(120)

HOSTILE = "<script>alert('x')</script>"


def asking(index: int) -> dict[str, Any]:
    """Task ``index`` whose prompt is a system message, then a user message of parts that
    opens with markup and runs long."""
    row = task_row(index, say=SOME_RIGHT)
    words = f"{HOSTILE} Which   value\nis task {index}? " + "more words " * 40
    row["responses_create_params"]["input"] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "input_text", "text": words}]},
    ]
    return row


async def asked_run(tmp: Path) -> Path:
    tasks = tmp / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(asking(i)) + b"\n" for i in range(6)))
    out = tmp / "run"
    async with running_stack() as stack:
        await collect(stack, tasks, out, repeats=3)
    return out


def test_the_hardest_tasks_show_their_prompt_escaped(tmp_path: Path) -> None:
    out = asyncio.run(asked_run(tmp_path))
    page = write_report(out).path.read_text()
    table = page.split("<h2>Hardest tasks: ")[1].split("</table>")[0]
    assert "<th>prompt</th>" in table
    shown = excerpt(f"{HOSTILE} Which value is task 0? " + "more words " * 40)
    assert len(shown) == EXCERPT and shown.endswith("…")
    assert f"<td>{html.escape(shown)}</td>" in table
    assert HOSTILE not in page  # never as markup, anywhere on the page
    assert html.escape(HOSTILE) in table
    assert "You are terse" not in table  # the user's message, not the system's


def test_prompt_excerpts_read_what_there_is(tmp_path: Path) -> None:
    assert first_user_text({"responses_create_params": {"input": "plain"}}) == "plain"
    assert first_user_text({"responses_create_params": {"input": [{"role": "system"}]}}) == ""
    assert first_user_text({"task_input": {}}) == ""
    assert excerpt("a  b\n\tc") == "a b c"
    # No tasks.jsonl (a damaged directory): no excerpts, no error.
    assert prompt_excerpts(tmp_path, [0, 1]) == {}
