import os
import subprocess
assert os.access("/app/greet.sh", os.X_OK)
# The agent's script runs as nobody: it cannot write /logs/verifier, nor touch this process.
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
def run(*args):
    return subprocess.run([*AS_NOBODY, "/app/greet.sh", *args], capture_output=True, text=True, timeout=10, cwd="/").stdout
assert run("Ada") == "Hello, Ada!\n"
assert run("Grace Hopper") == "Hello, Grace Hopper!\n"
assert run() == "Hello, world!\n"
