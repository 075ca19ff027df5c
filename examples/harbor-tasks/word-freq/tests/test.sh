#!/bin/bash
# The verifier: score.py (Python's site off) writes reward.json with a partial-credit reward.
mkdir -p /logs/verifier
python3 -I -S /tests/score.py || echo '{"reward": 0}' > /logs/verifier/reward.json
