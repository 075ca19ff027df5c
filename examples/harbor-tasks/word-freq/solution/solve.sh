#!/bin/bash
set -euo pipefail
tr 'A-Z' 'a-z' < /app/text.txt | grep -oE '[a-z]+' | sort | uniq -c \
  | awk '{print $2, $1}' | sort -k2,2nr -k1,1 | head -5 > /app/top.txt
