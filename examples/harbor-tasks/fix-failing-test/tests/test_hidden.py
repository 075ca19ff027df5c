"""The hidden tests. The agent's calc.py never runs in this process: each call is its own Python
run as nobody (it cannot write /logs/verifier, nor touch this process), answering in JSON; a
calc.py that exits early answers nothing and fails; one that loops is cut at 5 s a call (the
verifier has 60 s for all of them)."""

import json
import subprocess

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def call(expr):
    # json is imported before /app is on the path: a json.py of the agent's is not it.
    code = (
        "import json, sys; sys.path.insert(0, '/app'); from calc import add, mean; "
        f"print(json.dumps({expr}))"
    )
    done = subprocess.run(
        [*AS_NOBODY, "python3", "-I", "-S", "-c", code],
        capture_output=True, text=True, timeout=5, cwd="/",
    )
    assert done.returncode == 0, done.stderr[-500:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mean():
    assert call("mean([1, 2, 3, 6])") == 3
    assert call("mean([5])") == 5
    assert call("mean([1.5, 2.5])") == 2.0


def test_add_still_works():
    assert call("add(-1, 1)") == 0
