"""Partial credit: 0.2 per correct line, written to reward.json (Harbor's named rewards).

The expected lines are written here, not counted from /app/text.txt: the agent could rewrite
that file to a text whose answer it knows (a review paid itself 1.0 so)."""
import json
from pathlib import Path

want = ["the 12", "cat 9", "a 6", "and 6", "dog 6"]
try:
    got = Path("/app/top.txt").read_text().splitlines()
except OSError:
    got = []
right = sum(1 for i, line in enumerate(want) if i < len(got) and got[i].strip() == line)
Path("/logs/verifier/reward.json").write_text(json.dumps({"reward": right / 5, "lines_right": right}))
