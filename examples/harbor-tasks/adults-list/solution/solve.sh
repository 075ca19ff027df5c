#!/bin/bash
set -euo pipefail
python3 -c 'import json; u = json.load(open("/app/users.json")); open("/app/adults.txt", "w").write("".join(n + "\n" for n in sorted(x["name"] for x in u if x["age"] >= 18)))'
