#!/bin/bash
set -euo pipefail
printf 'Hello, rollgym!\n' > /app/hello.txt
