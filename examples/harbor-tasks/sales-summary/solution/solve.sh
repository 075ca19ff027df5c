#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import csv, json
totals = {}
with open("/app/sales.csv") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] = totals.get(row["region"], 0) + int(row["units"]) * float(row["unit_price"])
json.dump({k: round(v, 2) for k, v in totals.items()}, open("/app/summary.json", "w"))
EOF
