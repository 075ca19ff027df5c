"""The code environment against a policy that hunts for reward: every exploit found on the
shipped sandbox (each scored 1.0, hung the server or crashed the verifier there) now scores 0
or fails as the program's own error, and the server keeps serving after each."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollgym.envs.code.sandbox import Isolation, Sandbox, probe_isolation
from rollgym.envs.code.server import CodeEnv
from rollgym.testing import serve_server
from tests.envs.env_client import EnvClient

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"wall_seconds": 3.0, "cpu_seconds": 2, "parallel": 2}
ISOLATED = probe_isolation().namespaces
needs_namespaces = pytest.mark.skipif(not ISOLATED, reason="unshare namespaces unavailable")
WRONG_ADD = "def add(a, b):\n    return a - b\n"
ADD_ASSERTS = ("assert add(1, 2) == 3", "assert add(2, 2) == 4")
PREFIX = os.path.realpath(sys.base_prefix)  # the interpreter's, which the sandbox must see


def solution(code: str) -> str:
    return f"My solution:\n```python\n{code}\n```"


def row(**unit_tests: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "solve"},
        "verifier_metadata": {"unit_tests": unit_tests},
    }


async def verify(client: EnvClient, task: dict[str, Any], code: str) -> dict[str, Any]:
    status, body = await client.verify(task, solution(code))
    assert status == 200, body
    return dict(body)


async def assert_still_serving(client: EnvClient) -> None:
    status, health = await client.request("GET", "/health")
    assert status == 200 and health["status"] == "ok", health
    good = await verify(client, row(asserts=list(ADD_ASSERTS)), "def add(a, b):\n    return a + b")
    assert good["reward"] == 1.0, good


@pytest.fixture
async def code_env(connect: Callable[[str], EnvClient]) -> AsyncIterator[EnvClient]:
    async with serve_server(CodeEnv, name="code", options=LIMITS) as (url, _):
        yield connect(url)


EXIT_PATHS = {
    "os._exit(0)": "import os\nos._exit(0)\n",
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "raise SystemExit": "raise SystemExit(0)\n",
    "atexit os._exit": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook exits 0": (
        "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\nthreading_hook = None\n"
    ),
    "try/finally os._exit": "",  # built below: wraps the wrong add's module
    "__eq__ always true": (
        "class Anything(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Anything(0)\n"
    ),
    "bool always true": (
        "class Yes:\n    def __bool__(self):\n        return True\n"
        "    def __eq__(self, other):\n        return Yes()\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    "asserts read from __file__": (
        "import re\nsrc = open(__file__).read()\n"
        "found = dict(re.findall(r'add\\((\\d+, \\d+)\\) == (\\d+)', src))\n"
        "def add(a, b):\n    return int(found.get(f'{a}, {b}', -1))\n"
    ),
    "asserts read from argv or cmdline": (
        "import re, sys\nsrc = ' '.join(sys.argv) + open('/proc/self/cmdline').read()\n"
        "found = dict(re.findall(r'add\\((\\d+, \\d+)\\) == (\\d+)', src))\n"
        "def add(a, b):\n    return int(found.get(f'{a}, {b}', -1))\n"
    ),
    "caller frame read": (
        "import sys\n"
        "def add(a, b):\n"
        "    f = sys._getframe(1)\n"
        "    consts = [c for c in f.f_code.co_consts if isinstance(c, int) and c not in (a, b)]\n"
        "    return consts[-1] if consts else -1\n"
    ),
}


@pytest.mark.parametrize("exploit", sorted(EXIT_PATHS))
async def test_no_exit_path_hook_or_rigged_value_passes_an_assert(
    code_env: EnvClient, exploit: str
) -> None:
    code = EXIT_PATHS[exploit]
    if exploit == "try/finally os._exit":
        code = "import os\ntry:\n    pass\nfinally:\n    os._exit(0)\n"
    program = code if "def add" in code else WRONG_ADD + code
    result = await verify(code_env, row(asserts=list(ADD_ASSERTS)), program)
    assert result["reward"] == 0.0, result
    assert "passed" not in result["test_results"], result
    await assert_still_serving(code_env)


async def test_exit_paths_do_not_pass_call_based_or_stdio_tests(code_env: EnvClient) -> None:
    call = row(fn_name="add", inputs=["1\n2"], outputs=["3"])
    stdio = row(inputs=["1 2\n"], outputs=["3\n"])
    for code in ("import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n"):
        assert (await verify(code_env, call, WRONG_ADD + code))["reward"] == 0.0
        assert (await verify(code_env, stdio, "print(0)\n" + code))["reward"] == 0.0
    # Printing what the old call-based harness looked for is not a result either.
    forged = "print('\\n\\x00rollgym-result:3')\nimport os\nos._exit(0)\n"
    assert (await verify(code_env, call, WRONG_ADD + forged))["reward"] == 0.0
    await assert_still_serving(code_env)


async def test_a_correct_solution_still_passes_every_kind_of_assert(code_env: EnvClient) -> None:
    asserts = [
        "assert add(1, 2) == 3",
        "assert add(-1, 1) == 0, 'message'",
        "assert not is_even(3)\nassert is_even(4)",
        "assert abs(half(3) - 1.5) < 1e-9",
        "assert math.isclose(half(1), 0.5)",
        "assert sorted(pair()) == [1, 2] and isinstance(pair(), tuple)",
        "assert Solution().twice([1]) == [1, 1]",
        "assert [add(i, i) for i in range(3)] == [0, 2, 4]",
        "assert add(10 ** 30, 1) == 10 ** 30 + 1",
        "assert flag is True",
        "assert count('aab') == {'a': 2, 'b': 1}",
        "assert grouped() == {1: [2]}",
        "assert point() == (1, 2)",
        "assert list(squares(3)) == [0, 1, 4] and squares(3) != [0, 1, 4]",
        "assert list(map(str, squares(2))) == ['0', '1']",
        "assert sorted(signed(), key=abs) == [1, -2, 3]",
        "assert set(keys()) == {1} and keys() == {1}",
    ]
    code = (
        "from collections import Counter, defaultdict, namedtuple\n"
        "count = Counter\n"
        "def grouped():\n    d = defaultdict(list)\n    d[1].append(2)\n    return d\n"
        "def point():\n    return namedtuple('P', 'x y')(1, 2)\n"
        "def squares(n):\n    return (i * i for i in range(n))\n"
        "def signed():\n    return [3, -2, 1]\n"
        "def keys():\n    return {1: 2}.keys()\n"
        "def add(a, b):\n    return a + b\n"
        "def is_even(n):\n    return n % 2 == 0\n"
        "def half(x):\n    return x / 2\n"
        "def pair():\n    return (2, 1)\n"
        "class Solution:\n    def twice(self, xs):\n        return xs * 2\n"
        "flag = True\n"
    )
    result = await verify(code_env, row(asserts=asserts), code)
    assert result["test_results"] == ["passed"] * len(asserts), result


async def test_an_assert_that_cannot_be_judged_outside_the_sandbox_is_refused(
    code_env: EnvClient,
) -> None:
    for source, said in [
        # Judged since the split computes what does not depend on the solution; a
        # comprehension over the solution's own values, calling it per item, cannot be.
        ("assert all(f(i) == i for i in f(3))", "which the solution gives"),
        ("x = f(1)\nassert x == 1", "not an assert"),
        ("assert sorted(f([1]), key=lambda v: -v) == [1]", "lambda"),
    ]:
        status, body = await code_env.verify(row(asserts=[source]), solution("def f(x): return x"))
        assert status == 422, body
        assert said in body["error"]["message"] and "asserts[0]" in body["error"]["message"]


@pytest.fixture
def run_dir() -> Any:
    """A run's output directory inside the checkout, world-readable (as `rollgym run` leaves
    it), outside the scratch dirs that the shipped sandbox already hid."""
    (ROOT / "out").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=ROOT / "out", prefix="adversarial-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_namespaces
async def test_answers_in_readable_files_are_not_visible(
    code_env: EnvClient, run_dir: Path
) -> None:
    # A made-up problem whose only copy of the answer is the run's tasks.jsonl; the solution
    # searches every readable *.jsonl for its input and prints the matching output.
    secret = uuid.uuid4().hex
    task = row(inputs=[f"{secret}\n"], outputs=[f"answer-{secret}\n"])
    (run_dir / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    os.chmod(run_dir / "tasks.jsonl", 0o644)
    search = (
        "import os, json\nneedle = input().strip()\nfound = 'nothing'\n"
        "for top, dirs, files in os.walk('/'):\n"
        "    if top in ('/proc', '/sys', '/dev', '/usr', '/lib', '/lib64'):\n"
        "        dirs[:] = []\n        continue\n"
        "    for name in files:\n"
        "        if not name.endswith('.jsonl'):\n            continue\n"
        "        try:\n            text = open(os.path.join(top, name)).read()\n"
        "        except OSError:\n            continue\n"
        "        for line in text.splitlines():\n"
        "            if needle in line:\n"
        "                t = json.loads(line)['verifier_metadata']['unit_tests']\n"
        "                found = t['outputs'][t['inputs'].index(needle + '\\n')]\n"
        "print(found.strip())\n"
    )
    result = await verify(code_env, task, search)
    assert result["reward"] == 0.0 and result["test_results"] == ["wrong_answer"], result
    # Nothing of the host's but the way to the interpreter: no checkout, venv, run dir, /etc,
    # home directories; what /root or /home still hold lies under the interpreter's prefix.
    see = (
        "import os\nseen = []\n"
        f"for path in ({str(run_dir)!r}, {str(ROOT)!r}, {sys.prefix!r}, '/etc', '/work', '/var'):\n"
        "    seen += [path] if os.path.exists(path) else []\n"
        "for top in ('/root', '/home'):\n"
        "    for where, dirs, files in os.walk(top):\n"
        f"        seen += [os.path.join(where, f) for f in files if not where.startswith({PREFIX!r})]\n"
        "print(seen)\n"
    )
    shown = await verify(code_env, row(inputs=["\n"], outputs=["[]\n"]), see)
    assert shown["reward"] == 1.0, shown


@needs_namespaces
async def test_deep_trees_and_full_work_dirs_cannot_wedge_the_server(code_env: EnvClient) -> None:
    deep = "import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')\n"
    for _ in range(3):  # two such outputs wedged every later verify before
        result = await verify(code_env, row(inputs=["\n"], outputs=["deep\n"]), deep)
        assert result["test_results"] in (["passed"], ["runtime_error"]), result
    fill = (
        "n = 0\ntry:\n"
        "    while True:\n        open(f'f{n}', 'wb').write(b'x' * 2**20)\n        n += 1\n"
        "except OSError:\n    print('full' if n < 64 else 'unbounded')\n"
    )
    inodes = (
        "import os\nn = 0\ntry:\n    while n < 100000:\n        os.mkdir(f'd{n}')\n        n += 1\n"
        "except OSError:\n    pass\nprint('bounded' if n < 100000 else 'unbounded')\n"
    )
    assert (await verify(code_env, row(inputs=["\n"], outputs=["full\n"]), fill))["reward"] == 1
    assert (await verify(code_env, row(inputs=["\n"], outputs=["bounded\n"]), inodes))[
        "reward"
    ] == 1
    await assert_still_serving(code_env)


async def test_a_deep_tree_is_removed_without_namespaces(tmp_path: Path) -> None:
    # The fallback's work dir is on the host: it must go, however deep.
    fallback = Isolation(namespaces=False, user_namespace=False, switch_uid=False)
    sandbox = Sandbox(_limits(), parallel=1, uid_base=60000, isolation=fallback, server="code")
    deep = "import os\nprint(os.getcwd())\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
    run = await sandbox.run(deep, "")
    workdir = run.stdout.strip().splitlines()[0]
    assert workdir.startswith(tempfile.gettempdir()) and "rollgym-code-" in workdir, run
    assert not await asyncio.to_thread(os.path.lexists, workdir)
    assert sandbox.wedged() is None and sandbox._slots.qsize() == 1


def _limits() -> Any:
    from rollgym.envs.code.sandbox import Limits

    return Limits(wall_seconds=10.0, cpu_seconds=5)


async def test_model_output_never_crashes_a_verifier(code_env: EnvClient) -> None:
    stdio = row(inputs=["\n"], outputs=["1\n"])
    for printed in ("sNaN", "NaN", "-sNaN", "1e999999999", "Infinity", "\\udcff", "\\x00"):
        result = await verify(code_env, stdio, f"print({printed!r})")
        assert result["reward"] == 0.0, (printed, result)
    call = row(fn_name="f", inputs=["1"], outputs=["2"])
    for value in ("10**400", "float('nan')", "[[[[[[1]]]]]]", "{'a': 1}", "'2x'", "1e308*10"):
        result = await verify(code_env, call, f"def f(x):\n    return {value}")
        assert result["reward"] == 0.0, (value, result)
    asserted = row(asserts=["assert f(1) == 2", "assert f(1) * 3 == 6", "assert 2 ** f(1) == 4"])
    for value in ("10**5000", "float('inf')", "[1] * 10", "10**100", "object()", "'x' * 10**5"):
        result = await verify(code_env, asserted, f"def f(x):\n    return {value}")
        assert result["reward"] == 0.0, (value, result)
    # A forged report: the program writes its own line to the launcher's pipe (its number is
    # in /proc/self/cmdline), holding what the server's reader might choke on.
    forge = (
        "import json, os\ndef f(x):\n    return 0\n"
        "fd = json.loads(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[-2])['control_fd']\n"
        "os.write(fd, REPORT + b'\\n')\nos._exit(0)\n"
    )
    collide = (
        b'[["ok", ["S", ['
        + b", ".join(b'["i", "%x"]' % (k * (2**61 - 1)) for k in range(1, 20001))
        + b"]]]]"
    )
    for report in (
        b'[["ok", ["f", 1' + b"0" * 400 + b"]]]",
        b'[["ok", ["c", [1' + b"0" * 400 + b", 1]]]]",
        b'[["ok", ["i", "' + b"f" * (2**18 + 3) + b'"]]]',  # hex: past 2**20 bits
        b'[["ok", ' + b'["l", [' * 2000 + b"]]" * 2000 + b"]]",
        collide,
        b'{"not": "a list"}',
    ):
        code = f"REPORT = {report!r}\n" + forge
        result = await verify(code_env, row(asserts=["assert f(1) == 2"]), code)
        assert result["test_results"] == ["runtime_error"], (report[:40], result)
    # A string the program returns is never a format the server expands.
    fmt = row(asserts=["assert f(1) % 2 == 1"])
    result = await verify(code_env, fmt, "def f(x):\n    return '%0200000000d'")
    # Expanded, it would merely compare unequal: the reason shows it was refused unbuilt.
    assert result["test_reasons"] == ["the assertion raised TypeError"], result
    # A lone surrogate in the code itself (a JSON escape; not UTF-8): the program's error.
    sandbox = Sandbox(_limits(), parallel=1, uid_base=60000, isolation=probe_isolation(),
                      server="code")  # fmt: skip
    run = await sandbox.run("print('\ud800')", "")
    assert run.exit_code not in (0, None) and run.report.startswith(b"ready"), run
    await assert_still_serving(code_env)


@needs_namespaces
async def test_no_ipc_or_unix_socket_reaches_the_host(code_env: EnvClient, tmp_path: Path) -> None:
    key = int.from_bytes(os.urandom(3), "big") + 1
    shm = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.shmget({key}, 4096, 0o1666) >= 0)\n"
    )
    result = await verify(code_env, row(inputs=["\n"], outputs=["True\n"]), shm)
    assert result["reward"] == 1.0, result  # it could make one, in its own IPC namespace
    host = await asyncio.to_thread(Path("/proc/sysvipc/shm").read_text)
    assert not [ln for ln in host.splitlines() if ln.split()[:1] == [str(key)]]  # none survived
    path = tempfile.mktemp(prefix="rg-", dir="/tmp")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    try:
        reach = (
            "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({path!r})\n    print('reached')\nexcept OSError:\n    print('no')\n"
        )
        result = await verify(code_env, row(inputs=["\n"], outputs=["no\n"]), reach)
        assert result["reward"] == 1.0, result
    finally:
        listener.close()
        os.unlink(path)


async def test_without_namespaces_child_processes_and_sockets_are_refused(
    connect: Callable[[str], EnvClient],
) -> None:
    options = {**LIMITS, "require_namespaces": False}
    async with serve_server(CodeEnv, name="code", options=options) as (url, server):
        assert server._sandbox is not None
        server._sandbox.isolation = Isolation(
            namespaces=False, user_namespace=False, switch_uid=False
        )
        client = connect(url)
        for attempt in (
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import socket; socket.socket()'])",
            "import os\nos.system('true')",
            "import os\nos.fork()",
            "import socket\nsocket.socket()",
            "import ctypes\nctypes.CDLL(None).socket(2, 1, 0)",
            "import _posixsubprocess",
        ):
            result = await verify(client, row(inputs=["\n"], outputs=["\n"]), attempt)
            assert result["test_results"] == ["runtime_error"], (attempt, result)
            assert "PermissionError" in (result["test_reasons"][0] or ""), result


async def test_without_namespaces_the_default_refuses_to_run(
    connect: Callable[[str], EnvClient],
) -> None:
    async with serve_server(CodeEnv, name="code", options=LIMITS) as (url, server):
        assert server._sandbox is not None
        server._sandbox.isolation = Isolation(
            namespaces=False, user_namespace=False, switch_uid=False
        )
        status, body = await connect(url).verify(row(inputs=["\n"], outputs=["\n"]), solution("1"))
    assert status == 500 and body["error"]["type"] == "sandbox_error", body
    assert "require_namespaces" in body["error"]["message"]


async def test_a_wedged_sandbox_reports_unhealthy(code_env: EnvClient) -> None:
    # A slot held far past the wall limit is what a broken sandbox looks like.
    async with serve_server(CodeEnv, name="code", options=LIMITS) as (url, server):
        assert server._sandbox is not None
        server._sandbox._busy[99] = -1e9
        status, health = await EnvClient(code_env.http, url).request("GET", "/health")
    assert status == 503 and "wedged" in health["reason"], health


@pytest.mark.skipif(os.geteuid() != 0 or not ISOLATED, reason="the private-home layout needs root")
def test_the_bundled_config_passes_check_from_a_checkout_in_a_private_home(tmp_path: Path) -> None:
    # The common container case: a checkout under /root (0700), its venv inside it, made from
    # a pyenv interpreter that lives under /root too.
    home = Path(tempfile.mkdtemp(dir=Path.home(), prefix=".rollgym-test-"))
    try:
        os.chmod(home, 0o700)
        shutil.copytree(ROOT / "src", home / "src", ignore=shutil.ignore_patterns("__pycache__"))
        venv = home / ".venv"
        subprocess.run(
            [sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(venv)],
            check=True, timeout=120, capture_output=True,
        )  # fmt: skip
        python = str(venv / "bin" / "python")
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, timeout=60, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        # The checkout's dependencies from this venv, its own code from the copy.
        ours = sysconfig_purelib()
        Path(site, "deps.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        env = {**os.environ, "PYTHONPATH": str(home / "src")}
        probe = subprocess.run(
            [python, "-c", "import rollgym, sys; print(rollgym.__file__, sys.prefix)"],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert probe.stdout.startswith(str(home)) and str(venv) in probe.stdout, probe.stdout
        config = home / "src" / "rollgym" / "envs" / "code" / "config.yaml"
        done = subprocess.run(
            [python, "-m", "rollgym", "check", str(config)],
            env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        shutil.rmtree(home, ignore_errors=True)


def sysconfig_purelib() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


@needs_namespaces
def test_an_exploit_scores_0_through_a_full_run(tmp_path: Path) -> None:
    exploit = "Here.\n\n```python\n" + WRONG_ADD + "import os\nos._exit(0)\n```"
    honest = "Here.\n\n```python\ndef add(a, b):\n    return a + b\n```"
    rows = [
        {
            "responses_create_params": {
                "input": "write add(a, b)",
                "metadata": {"rollgym_script": json.dumps([{"say": say}])},
            },
            "verifier_metadata": {"unit_tests": {"asserts": list(ADD_ASSERTS)}},
        }
        for say in (exploit, honest)
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = yaml.safe_load((ROOT / "src/rollgym/envs/code/config.yaml").read_text())
    config["collect"] = {"input": "tasks.jsonl", "repeats": 1, "concurrency": 2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "rollgym"), "run", str(tmp_path / "config.yaml"),
         "--output", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    reward = {r["task_index"]: r["reward"] for r in rollouts}
    assert reward == {0: 0.0, 1: 1.0}, rollouts


def test_the_event_loop_is_not_left_with_tasks() -> None:
    # The sandbox's supervision must not leak readers: a run in a fresh loop ends cleanly.
    async def one() -> int:
        sandbox = Sandbox(_limits(), parallel=1, uid_base=60000, isolation=probe_isolation(),
                          server="code")  # fmt: skip
        await sandbox.run("print(1)", "")
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    assert asyncio.run(one()) == 0


_DRIVER = """
import json, os, subprocess, sys
launcher, program = sys.argv[1], sys.argv[2]
r, w = os.pipe()
limits = {"cpu_seconds": 5, "wall_seconds": 20, "memory_bytes": 512 * 2**20, "processes": 64,
          "open_files": 64, "file_bytes": 2**24, "output_bytes": 2**20, "work_bytes": 2**24,
          "work_inodes": 1024}
spec = {"limits": limits, "uid": None, "isolate": True, "control_fd": w, "mode": "stdio",
        "fn_name": None}
header = json.dumps({"program": program, "probes": []}).encode()
ns = ["--user", "--map-root-user", "--net", "--pid", "--ipc", "--uts", "--mount", "--fork",
      "--kill-child", "--mount-proc"]
done = subprocess.run(["unshare", *ns, sys.executable, "-I", launcher, json.dumps(spec)],
                      input=b"%d\\n%b" % (len(header), header), capture_output=True,
                      pass_fds=(w,), timeout=60)
os.close(w)
print(json.dumps({"out": done.stdout.decode(), "err": done.stderr.decode()[-2000:],
                  "ready": os.read(r, 100).startswith(b"ready")}))
"""
_ESCAPES = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
cap = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("CapEff")][0]
tried = {
    "mount": libc.mount(b"tmpfs", b"/tmp/work", b"tmpfs", 0, None) == 0,
    "unshare": libc.unshare(0x10000000) == 0,
    "host": [p for p in ("/work", "/root", "/home", "/etc", "/run") if os.path.exists(p)],
}
try:
    os.chroot("/tmp")
    tried["chroot"] = True
except OSError:
    tried["chroot"] = False
print(os.getuid(), int(cap, 16), tried)
"""


HARNESS = [f"rollgym/{name}" for name in ("__init__.py", "version.py", "envs/__init__.py")] + [
    f"rollgym/envs/code/{name}.py"
    for name in ("__init__", "launcher", "codec", "confine", "isolation")
]


def _as_nobody(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_as_a_normal_user_the_run_keeps_no_capability() -> None:
    # The user-namespace path: a server run by a normal user. Driven from the system's own
    # interpreter as `nobody` (the test's venv may live where nobody can read it).
    system = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not shutil.which("setpriv") or system is None:
        pytest.skip("needs root (to become nobody), setpriv and a system python3")
    if _as_nobody("unshare", "--user", "--map-root-user", "true").returncode != 0:
        pytest.skip("user namespaces are not available to a normal user here")
    work = Path(tempfile.mkdtemp(prefix="rollgym-userns-"))
    try:
        # Only the harness's files, run by the system's interpreter (no third-party package):
        # what the launcher imports is the standard library and these.
        for name in HARNESS:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "src" / name, work / name)
        (work / "driver.py").write_text(_DRIVER)
        for path in [work, *work.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        launcher = str(work / "rollgym/envs/code/launcher.py")
        done = _as_nobody(system, "-I", str(work / "driver.py"), launcher, _ESCAPES)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ready"], report
    expected = "0 0 {'mount': False, 'unshare': False, 'host': [], 'chroot': False}"
    assert report["out"].strip() == expected, report


_FILTERED = """
import ctypes, json, os, socket, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from rollgym.envs.code import confine
confine.seccomp(fallback=sys.argv[2] == "fallback")
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = exc.errno
def _fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
attempt("fork", _fork)
attempt("subprocess", lambda: subprocess.run(["true"], check=True))
attempt("socket", lambda: socket.socket().close())
attempt("kill parent", lambda: os.kill(os.getppid(), 0))
attempt("kill self", lambda: os.kill(os.getpid(), 0))
attempt("thread", lambda: (t := threading.Thread(target=int), t.start(), t.join()))
out["unshare"] = libc.unshare(0x10000000) == 0 or ctypes.get_errno()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no filter here")
@pytest.mark.parametrize("mode", ["fallback", "namespaces"])
def test_the_kernel_filter_holds_whatever_python_code_does(mode: str) -> None:
    # The audit hook of the fallback is Python's: a module loaded under another name gets
    # round it. The seccomp filter is the kernel's, inherited by every child, never removed.
    done = subprocess.run(
        [sys.executable, "-I", "-c", _FILTERED, str(ROOT / "src"), mode],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    eperm = 1
    assert got["unshare"] == eperm and got["thread"] == "ok" and got["kill self"] == "ok", got
    if mode == "fallback":
        assert got["fork"] == got["subprocess"] == got["socket"] == eperm, got
        assert got["kill parent"] == eperm, got
    else:  # with namespaces these are the namespaces' business
        assert got["fork"] == got["subprocess"] == got["socket"] == "ok", got
