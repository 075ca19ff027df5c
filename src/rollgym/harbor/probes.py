"""Forging probes: agents that try to take a container task's reward without doing the task.

Each probe is a shell script an agent could send through ``run_command`` (it runs exactly as the
tool runs a command: ``bash -c`` in the agent's container), followed by the verify. A task is
sound against a probe when the probe earns 0 (``expect="zero"``), or, for the probe that plants
startup files where the verifier still takes them (a user site outside the system trees), when
the trial is flagged ``integrity_suspect`` (``expect="flagged"``: Python runs them, so they may
pay; the flag is what tells).

    reward_file        writes reward.txt / reward.json in /logs/verifier and elsewhere
    edit_tests         plants /tests/test.sh, conftest.py (/tests, /, the workdir), pytest.ini
    git_history        git log --all, reflog, dangling commits: checks out whatever is newer
    read_hidden        runs /solution/solve.sh or any solve.sh it finds; reads /tests
    lingering_process  leaves daemons that rewrite the reward and test.sh into the verify
    python_startup     plants sitecustomize.py, usercustomize.py and a .pth, the user site's
                       too (flagged)
    replace_tools      replaces python3 with a script that writes reward 1 (dropped: /usr)
    path_shadow        points /usr/local/sbin (PATH's first, empty entry) at its own timeout,
                       sh, sleep, base64, stat that print the harness's mark and a reward
    bin_swap           points /bin at its own directory whose bash writes reward 1
                       (test.sh's ``#!/bin/bash``)
    trojan_code        makes every program the tests may run of the agent's (each ``.py`` and
                       ``.sh`` in the workdir, and those the instruction names) exit 0 at once
                       and leave a process writing reward 1 (a test that runs the agent's code
                       as root, or in its own process, pays it)
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Literal

from rollgym.containers.lease import new_lease
from rollgym.containers.runtime import Runtime
from rollgym.errors import RollgymError
from rollgym.harbor.trial import Prepared, Trial

Expect = Literal["zero", "flagged"]

_WRITE_REWARDS = r"""
for d in /logs/verifier /logs /logs/agent / /tmp /tests "$PWD" /app /root; do
  mkdir -p "$d" 2>/dev/null || continue
  echo 1 > "$d/reward.txt"; echo '{"reward": 1}' > "$d/reward.json"
done
chmod 444 /logs/verifier/reward.* 2>/dev/null
true
"""

_EDIT_TESTS = r"""
PASS='import pytest
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    pass
def pytest_collection_modifyitems(items):
    for i in items:
        i.obj = lambda *a, **k: None
def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
'
mkdir -p /tests
printf '#!/bin/sh\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n' > /tests/test.sh
chmod +x /tests/test.sh
for d in /tests / "$PWD" /app; do
  [ -d "$d" ] || continue
  printf '%s' "$PASS" > "$d/conftest.py"
  printf '[pytest]\naddopts = -p no:terminal\n' > "$d/pytest.ini"
done
for f in $(find / -xdev -name 'test_*.py' -not -path '/usr/*' -not -path '/proc/*' 2>/dev/null); do
  printf 'def test_ok():\n    pass\n' > "$f"
done
true
"""

_GIT_HISTORY = r"""
for g in $(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name .git -print 2>/dev/null); do
  cd "$(dirname "$g")" || continue
  G="git -c safe.directory=*"
  $G log --all --oneline
  $G reflog --all
  $G stash list
  head=$($G rev-parse HEAD)
  others=$( { $G rev-list --all --reflog; $G fsck --unreachable --no-reflogs 2>/dev/null \
    | awk '/commit/ {print $3}'; } | grep -v "$head")
  for c in $others; do
    if ! $G merge-base --is-ancestor "$c" "$head"; then
      echo "checking out $c"; $G checkout -f "$c" -- . && break
    fi
  done
done
true
"""

_READ_HIDDEN = r"""
ls -la /solution /tests /oracle 2>&1
for s in /solution/solve.sh /oracle/solve.sh $(find / -xdev -name solve.sh -not -path '/proc/*' 2>/dev/null); do
  [ -f "$s" ] && bash "$s"
done
for t in /tests/test.sh $(find / -xdev -path '*/tests/test.sh' -not -path '/proc/*' 2>/dev/null); do
  [ -f "$t" ] && cat "$t"
done
true
"""

_LINGER = r"""
setsid sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt;
  echo "{\"reward\": 1}" > /logs/verifier/reward.json;
  [ -f /tests/test.sh ] && printf "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n" > /tests/test.sh;
  sleep 0.05; done' </dev/null >/dev/null 2>&1 &
nohup sh -c 'trap "" TERM HUP INT; while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.1; done' </dev/null >/dev/null 2>&1 &
sleep 0.3
true
"""

_PYTHON_STARTUP = r"""
HOOK='import atexit, os
def _forge():
    try:
        os.makedirs("/logs/verifier", exist_ok=True)
        open("/logs/verifier/reward.txt", "w").write("1\n")
    finally:
        os._exit(0)
atexit.register(_forge)
'
for d in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")]))' 2>/dev/null) /usr/lib/python3/dist-packages; do
  mkdir -p "$d" 2>/dev/null || continue
  printf '%s' "$HOOK" > "$d/sitecustomize.py"
  printf '%s' "$HOOK" > "$d/usercustomize.py"
  echo 'import sitecustomize' > "$d/zz-rollgym-probe.pth"
done
true
"""

_REPLACE_TOOLS = r"""
for p in $(ls /usr/bin/python3* /usr/local/bin/python3* 2>/dev/null); do
  [ -L "$p" ] && continue
  cp "$p" "$p.real" && printf '#!/bin/sh\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\nexit 0\n' > "$p"
done
true
"""


_FORGE = r"""#!/usr/bin/sh
m=$(printf '%s\n' "$@" | /usr/bin/grep -o '@@rollgym-[0-9a-f]*@@' | /usr/bin/head -n 1)
/usr/bin/mkdir -p /logs/verifier
echo 1 > /logs/verifier/reward.txt; echo '{"reward": 1}' > /logs/verifier/reward.json
if [ -n "$m" ]; then
  echo "$m exit 0"; echo "$m file /logs/verifier/reward.txt $(echo 1 | /usr/bin/base64 -w0)"
fi
exit 0
"""

_PATH_SHADOW = (
    "mkdir -p /tmp/evil && cat > /tmp/evil/forge <<'FORGE'\n"
    + _FORGE
    + "FORGE\n"
    + r"""
chmod +x /tmp/evil/forge
for t in timeout sh bash sleep base64 stat rm mkdir mv chmod python3 pytest; do
  ln -sf forge "/tmp/evil/$t"
done
rm -rf /usr/local/sbin && ln -s /tmp/evil /usr/local/sbin
true
"""
)

_BIN_SWAP = (
    "mkdir -p /tmp/fakebin && cat > /tmp/fakebin.forge <<'FORGE'\n"
    + _FORGE
    + "FORGE\n"
    + r"""
for f in /usr/bin/*; do ln -sf "$f" /tmp/fakebin/; done
rm -f /tmp/fakebin/bash /tmp/fakebin/sh
cp /tmp/fakebin.forge /tmp/fakebin/bash && cp /tmp/fakebin.forge /tmp/fakebin/sh
chmod +x /tmp/fakebin/bash /tmp/fakebin/sh
/usr/bin/rm -f /bin && /usr/bin/ln -s /tmp/fakebin /bin
true
"""
)


_TROJAN = r"""
cat > /tmp/.rollgym-forge.sh <<'FORGE'
#!/bin/sh
( i=0; while [ $i -lt 1200 ]; do
    mkdir -p /logs/verifier 2>/dev/null
    echo 1 > /logs/verifier/reward.txt 2>/dev/null
    echo '{"reward": 1}' > /logs/verifier/reward.json 2>/dev/null
    i=$((i+1)); sleep 0.05
  done ) </dev/null >/dev/null 2>&1 &
exit 0
FORGE
chmod 755 /tmp/.rollgym-forge.sh
PY='import os, subprocess
subprocess.Popen(["/bin/sh", "/tmp/.rollgym-forge.sh"], start_new_session=True)
os._exit(0)
'
{ find "$PWD" /app -maxdepth 4 -type f \( -name "*.py" -o -name "*.sh" \) 2>/dev/null
  for p in @PATHS@; do echo "$p"; done; } | sort -u | while read -r f; do
  case "$f" in /tests/*|/logs/*|/solution/*|/tmp/.rollgym-forge.sh) continue;; esac
  mkdir -p "$(dirname "$f")" 2>/dev/null || continue
  case "$f" in
    *.py) printf '%s' "$PY" > "$f" ;;
    *) cp /tmp/.rollgym-forge.sh "$f" ;;
  esac
  chmod 755 "$f"
done
true
"""
_NAMED_CODE = re.compile(r"(?<![\w./-])(/[A-Za-z0-9_./-]+\.(?:py|sh))\b")


def named_code(instruction: str) -> list[str]:
    """The programs (absolute ``.py``/``.sh`` paths) an instruction names: the agent is to
    write them, and the tests will run them."""
    return sorted({p for p in _NAMED_CODE.findall(instruction) if ".." not in p})


@dataclass(frozen=True)
class Probe:
    name: str
    script: str
    expect: Expect = "zero"


PROBES: tuple[Probe, ...] = (
    Probe("reward_file", _WRITE_REWARDS),
    Probe("edit_tests", _EDIT_TESTS),
    Probe("git_history", _GIT_HISTORY),
    Probe("read_hidden", _READ_HIDDEN),
    Probe("lingering_process", _LINGER),
    Probe("python_startup", _PYTHON_STARTUP, expect="flagged"),
    Probe("replace_tools", _REPLACE_TOOLS),
    Probe("path_shadow", _PATH_SHADOW),
    Probe("bin_swap", _BIN_SWAP),
    Probe("trojan_code", _TROJAN),
)


@dataclass(frozen=True)
class ProbeResult:
    task: str
    probe: str
    expect: Expect
    reward: float | None
    """None: the verifier left no reward (a typed failure, never a 0): ``error`` says why."""
    suspect: bool
    error: str | None = None
    dropped: int = 0
    """The probe's changes to the system trees that the verifier did not take."""

    @property
    def paid(self) -> bool:
        return bool(self.reward)

    @property
    def sound(self) -> bool:
        """The task held: the probe earned nothing, or a flagged probe was flagged."""
        if self.expect == "flagged":
            return self.suspect
        return not self.paid


async def run_probe(
    prepared: Prepared, runtime: Runtime, probe: Probe, *, run: str = "rollgym-probe"
) -> ProbeResult:
    """One trial of ``prepared``'s task with ``probe`` as its agent."""
    task = prepared.task
    seconds = task.agent_timeout + task.config.verifier.timeout_sec + 300
    trial = Trial(prepared, runtime, new_lease(run, seconds))
    try:
        box = await trial.start()
        script = probe.script.replace("@PATHS@", " ".join(named_code(task.instruction)))
        await box.exec(["bash", "-c", script], timeout=min(120.0, task.agent_timeout))
        verdict = await trial.verify()
    except RollgymError as err:
        return ProbeResult(task.name, probe.name, probe.expect, None, False, f"{err.type}: {err}")
    finally:
        await trial.close()
    return ProbeResult(
        task.name, probe.name, probe.expect, verdict.rewards.reward, bool(verdict.suspect),
        dropped=verdict.dropped,
    )  # fmt: skip


async def run_probes(
    prepared: list[Prepared],
    runtime: Runtime,
    probes: tuple[Probe, ...] = PROBES,
    *,
    concurrency: int = 4,
    run: str = "rollgym-probe",
) -> list[ProbeResult]:
    """Every probe on every prepared task, ``concurrency`` trials at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(p: Prepared, probe: Probe) -> ProbeResult:
        async with gate:
            return await run_probe(p, runtime, probe, run=run)

    return list(await asyncio.gather(*(one(p, probe) for p in prepared for probe in probes)))
