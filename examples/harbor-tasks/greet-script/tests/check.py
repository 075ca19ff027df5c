import os
import subprocess
assert os.access("/app/greet.sh", os.X_OK)
def run(*args):
    return subprocess.run(["/app/greet.sh", *args], capture_output=True, text=True, timeout=10).stdout
assert run("Ada") == "Hello, Ada!\n"
assert run("Grace Hopper") == "Hello, Grace Hopper!\n"
assert run() == "Hello, world!\n"
