#!/bin/bash
set -euo pipefail
cd /app/tree && grep -rlw needle . | sed 's|^\./||' > /app/answer.txt
