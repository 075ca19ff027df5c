#!/bin/bash
# The verifier: runs check.py with Python's site off (no sitecustomize, no .pth files, no user
# site: nothing the agent could have planted runs) and writes the reward Harbor reads.
mkdir -p /logs/verifier
if python3 -I -S /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
