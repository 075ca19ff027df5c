"""Partial credit: 0.2 per correct line, written to reward.json (Harbor's named rewards)."""
import json
import re
from collections import Counter
from pathlib import Path

words = re.findall(r"[a-z]+", Path("/app/text.txt").read_text().lower())
want = [f"{w} {n}" for w, n in sorted(Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
try:
    got = Path("/app/top.txt").read_text().splitlines()
except OSError:
    got = []
right = sum(1 for i, line in enumerate(want) if i < len(got) and got[i].strip() == line)
Path("/logs/verifier/reward.json").write_text(json.dumps({"reward": right / 5, "lines_right": right}))
