import csv
import json
from pathlib import Path
want = {}
with open("/app/sales.csv") as f:
    for row in csv.DictReader(f):
        want[row["region"]] = want.get(row["region"], 0) + int(row["units"]) * float(row["unit_price"])
want = {k: round(v, 2) for k, v in want.items()}
assert want == {"north": 32.5, "south": 15.0, "east": 54.97, "west": 11.25}, want
got = json.loads(Path("/app/summary.json").read_text())
assert isinstance(got, dict) and set(got) == set(want), got
assert all(abs(float(got[k]) - v) < 0.005 for k, v in want.items()), got
