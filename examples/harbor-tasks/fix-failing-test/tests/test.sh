#!/bin/bash
# The verifier: the hidden tests under pytest, with Python's site off (no sitecustomize or .pth
# the agent could plant), no plugin autoloading, conftest.py read from /tests only, and no
# configuration file read (pytest looks for one upward from /tests, to /: "-c /dev/null").
mkdir -p /logs/verifier
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
cd /tests
if python3 -I -S -c 'import sys; sys.path.append("/usr/lib/python3/dist-packages"); import pytest; sys.exit(pytest.main(["-q", "-c", "/dev/null", "-p", "no:cacheprovider", "--rootdir=/tests", "--confcutdir=/tests", "/tests/test_hidden.py"]))'; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
