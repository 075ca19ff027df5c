#!/bin/bash
set -euo pipefail
awk '$2 == "ERROR"' /app/server.log | wc -l > /app/answer.txt
