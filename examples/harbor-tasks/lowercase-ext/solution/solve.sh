#!/bin/bash
set -euo pipefail
cd /app/photos
for f in *.*; do
  ext="${f##*.}"; low=$(printf '%s' "$ext" | tr 'A-Z' 'a-z')
  [ "$ext" = "$low" ] || mv -- "$f" "${f%.*}.$low"
done
