#!/bin/bash
set -euo pipefail
cat > /app/greet.sh <<'EOF'
#!/bin/sh
echo "Hello, ${1:-world}!"
EOF
chmod +x /app/greet.sh
