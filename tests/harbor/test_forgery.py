"""The verifier starts from the prepared image plus the agent's changes outside the system trees,
read on the host: the forgeries an independent review reproduced against the snapshot design
earn 0 (and the dropped system change is reported), the agent's real work (deletions, a
directory made again, links) reaches the verifier as it left it, a task may opt out, a
cancelled verify can be run again, and the containers' CPU seconds are counted."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import rollgym.harbor.trial as trial_module
from rollgym.containers.lease import new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.harbor.image import prepare
from rollgym.harbor.probes import PROBES
from rollgym.harbor.task import load_task
from rollgym.harbor.trial import Prepared, Trial, Verdict
from tests.harbor.conftest import BUNDLED, needs_podman

pytestmark = [needs_podman, pytest.mark.timeout(600)]

DOCKERFILE = """FROM debian:bookworm
WORKDIR /app
RUN echo keep > /app/keep && echo gone > /app/gone \\
 && printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /app/run.sh && chmod +x /app/run.sh
"""
REWARD = "mkdir -p /logs/verifier\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
TESTS = {
    # what test.sh checks (a shell condition)
    "deleted": '[ ! -e /app/gone ] && [ "$(cat /app/keep)" = keep ]',
    "opaque": '[ "$(ls -A /app)" = y ] && [ "$(cat /app/y)" = x ]',
    "links": '[ "$(readlink /app/s)" = /etc/shadow ] && [ -L /app/up ] && [ -L /app/s.copy ]',
    "package": "python3 -c 'import agentpkg'",
    "relinked": "[ ! -L /var/run ] && [ -f /var/run/mine ] && [ ! -e /run/mine ]",
    "burn": "true",
}
SITE = "$(python3 -c 'import site; print(site.getsitepackages()[0])')"


def make_task(root: Path, name: str, test: str, toml: str = "") -> Path:
    task = root / name
    shutil.copytree(BUNDLED / "hello-file", task)
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (task / "task.toml").write_text(toml + "[verifier]\ntimeout_sec = 60.0\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    return task


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Prepared]:
    root = tmp_path_factory.mktemp("forgery-tasks")
    dirs = {
        name: make_task(root, name, REWARD.format(check=check)) for name, check in TESTS.items()
    }
    dirs["package-kept"] = make_task(
        root, "package-kept", REWARD.format(check=TESTS["package"]),
        "[metadata]\nrollgym_keep_system_changes = true\n",
    )  # fmt: skip
    dirs["runner"] = make_task(root, "runner", "mkdir -p /logs/verifier\nexec /app/run.sh\n")
    # Its test passes with no work at all: a 0 can only be the disk limit's.
    dirs["small-disk"] = make_task(
        root,
        "small-disk",
        REWARD.format(check="[ -f /app/keep ]"),
        "[environment]\nstorage_mb = 64\n",
    )

    async def all_prepared() -> dict[str, Prepared]:
        runtime = PodmanRuntime()
        lease = new_lease("rollgym-test-forgery", 3600)
        made = await asyncio.gather(*(prepare(load_task(d), runtime, lease) for d in dirs.values()))
        return dict(zip(dirs, made, strict=True))

    return asyncio.run(all_prepared())


async def play(prepared: Prepared, script: str) -> Verdict:
    trial = Trial(prepared, PodmanRuntime(), new_lease(f"rollgym-test-{secrets.token_hex(3)}", 600))
    try:
        box = await trial.start()
        done = await box.exec(["bash", "-c", script], timeout=120)
        assert done.exit_code == 0, done
        return await trial.verify()
    finally:
        await trial.close()


def probe(name: str) -> str:
    return next(p.script for p in PROBES if p.name == name)


async def test_path_shadow_forgery_earns_nothing_and_is_reported(prepared: dict[str, Any]) -> None:
    # (a) /usr/local/sbin, PATH's first and empty entry, pointed at the agent's timeout, sh,
    # base64, stat: they saw the harness's script (its mark) and printed a reward.
    verdict = await play(prepared["hello-file"], probe("path_shadow"))
    assert verdict.rewards.reward == 0.0 and verdict.broken is None
    assert "/usr/local/sbin" in verdict.dropped_shown and not verdict.suspect
    assert verdict.fields()["harbor_system_changes_dropped"] >= 1


async def test_bin_swap_forgery_earns_nothing_and_is_reported(prepared: dict[str, Any]) -> None:
    # (b) /bin (a link to usr/bin) pointed at the agent's directory: test.sh's #!/bin/bash.
    verdict = await play(prepared["hello-file"], probe("bin_swap"))
    assert verdict.rewards.reward == 0.0
    assert "/bin" in verdict.dropped_shown and not verdict.suspect


async def test_loader_preload_and_a_fake_python_are_dropped(prepared: dict[str, Any]) -> None:
    script = (
        "printf '#!/bin/sh\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\n' "
        "> /tmp/fake && chmod +x /tmp/fake && echo /tmp/evil.so > /etc/ld.so.preload"
        " && py=$(readlink -f /usr/bin/python3) && cp /tmp/fake $py"
        " && printf 'Hello, rollgym?\\n' > /app/hello.txt"
    )
    verdict = await play(prepared["hello-file"], script)
    assert verdict.rewards.reward == 0.0
    assert "/etc/ld.so.preload" in verdict.dropped_shown
    assert any(p.startswith("/usr/bin/python3") for p in verdict.dropped_shown)


async def test_the_agents_work_without_forgery_still_pays(prepared: dict[str, Any]) -> None:
    # The same system change beside the real answer: dropped, and the answer pays.
    script = "echo x > /usr/bin/planted && printf 'Hello, rollgym!\\n' > /app/hello.txt"
    verdict = await play(prepared["hello-file"], script)
    assert verdict.rewards.reward == 1.0 and verdict.dropped_shown == ["/usr/bin/planted"]


async def test_a_deleted_workspace_file_is_deleted_for_the_verifier(
    tasks: dict[str, Prepared],
) -> None:
    assert (await play(tasks["deleted"], "rm /app/gone")).rewards.reward == 1.0
    assert (await play(tasks["deleted"], "true")).rewards.reward == 0.0  # the control


async def test_a_directory_made_again_holds_only_what_the_agent_put(
    tasks: dict[str, Prepared],
) -> None:
    verdict = await play(tasks["opaque"], "cd / && rm -rf /app && mkdir /app && echo x > /app/y")
    assert verdict.rewards.reward == 1.0


async def test_a_link_of_the_image_made_a_directory_is_never_written_through(
    tasks: dict[str, Prepared],
) -> None:
    # /var/run is a link to /run in the image: the agent's directory in its place is unpacked
    # as a directory, not through the image's link.
    verdict = await play(
        tasks["relinked"], "rm /var/run && mkdir /var/run && echo x > /var/run/mine"
    )
    assert verdict.rewards.reward == 1.0


async def test_links_are_carried_as_links_never_what_they_point_to(
    tasks: dict[str, Prepared],
) -> None:
    script = (
        "ln -s /etc/shadow /app/s && ln -s ../../../../../../../etc/passwd /app/up"
        " && ln -s /proc/self/root/etc/shadow /app/s.copy"
    )
    assert (await play(tasks["links"], script)).rewards.reward == 1.0


async def test_a_package_in_the_system_trees_is_dropped_unless_the_task_keeps_them(
    tasks: dict[str, Prepared],
) -> None:
    script = f"echo 'X = 1' > {SITE}/agentpkg.py && python3 -c 'import agentpkg'"
    dropped = await play(tasks["package"], script)
    assert dropped.rewards.reward == 0.0 and dropped.dropped >= 1 and not dropped.suspect
    kept = await play(tasks["package-kept"], script)
    assert kept.rewards.reward == 1.0 and kept.dropped == 0
    assert any(p.endswith("/agentpkg.py") for p in kept.suspect), kept.suspect
    assert kept.fields()["integrity_suspect"] == 1.0


async def test_a_verification_the_agent_broke_is_zero_and_flagged(
    tasks: dict[str, Prepared],
) -> None:
    assert (await play(tasks["runner"], "true")).rewards.reward == 1.0  # the control
    verdict = await play(tasks["runner"], "rm /app/run.sh")
    assert verdict.rewards.reward == 0.0 and verdict.broken and verdict.test_exit == 127
    assert verdict.fields()["harbor_verify_broken"] == 1.0


async def test_a_cancelled_verify_runs_again_to_a_verdict(tasks: dict[str, Prepared]) -> None:
    trial = Trial(tasks["deleted"], PodmanRuntime(), new_lease("rollgym-test-cancel", 600))
    try:
        box = await trial.start()
        await box.exec("rm /app/gone", timeout=60)
        # The caller cancelled (its client gave up): the run goes on, and a retry joins it.
        caller = asyncio.ensure_future(trial.verify())
        await asyncio.sleep(0.5)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        # The run itself cancelled (a shutdown): the next verify runs the verifier again from
        # the agent's kept changes, not a cached failure.
        inner = trial._verifying
        assert inner is not None
        inner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inner
        verdict = await asyncio.wait_for(trial.verify(), 300)
        assert verdict.rewards.reward == 1.0
        assert await trial.verify() is verdict  # a finished verdict is kept
    finally:
        await trial.close()
    assert trial.changes is None


async def test_sandbox_seconds_are_the_containers_cpu(tasks: dict[str, Prepared]) -> None:
    verdict = await play(tasks["burn"], "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done")
    assert verdict.sandbox_s is not None and verdict.sandbox_s > 0.2
    assert verdict.fields()["sandbox_s"] == round(verdict.sandbox_s, 3)


async def test_the_verifier_has_a_lease_of_its_own(tasks: dict[str, Prepared]) -> None:
    # An agent phase that used up its lease (a model that thought long) still gets a verifier:
    # the verifier's deadline is its own, not what is left of the agent's.
    trial = Trial(tasks["deleted"], PodmanRuntime(), new_lease("rollgym-test-lease", 600))
    try:
        box = await trial.start()
        await box.exec("rm /app/gone", timeout=60)
        trial.lease = dataclasses.replace(trial.lease, deadline=time.time() - 1)
        assert (await trial.verify()).rewards.reward == 1.0
    finally:
        await trial.close()


async def test_a_name_that_is_not_utf8_is_reported_escaped(prepared: dict[str, Any]) -> None:
    verdict = await play(prepared["hello-file"], "touch /usr/bin/$'\\xff'planted /app/$'\\xfe'.pth")
    assert verdict.dropped_shown == ["/usr/bin/\\xffplanted"]
    assert verdict.suspect == ["+/app/\\xfe.pth"]
    orjson.dumps(verdict.fields())  # the verify's answer can carry them


async def test_changes_past_the_bounds_pay_zero_flagged(
    tasks: dict[str, Prepared], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trial_module, "CHANGE_BOUNDS", (1 << 20, 50))
    verdict = await play(
        tasks["deleted"], "rm /app/gone && mkdir /app/many && cd /app/many && touch $(seq 100)"
    )
    assert verdict.rewards.reward == 0.0 and verdict.broken and "too large" in verdict.broken
    assert verdict.fields()["harbor_verify_broken"] == 1.0


async def test_an_agent_past_storage_mb_earns_nothing_and_is_flagged(
    tasks: dict[str, Prepared],
) -> None:
    trial = Trial(tasks["small-disk"], PodmanRuntime(), new_lease("rollgym-test-disk", 600))
    try:
        box = await trial.start()
        # Ended by the disk watchdog midway or caught by the measure at the agent phase's end.
        await box.exec(["sh", "-c", "fallocate -l 1G /app/big; sleep 30"], timeout=90)
        verdict = await trial.verify()
    finally:
        await trial.close()
    assert verdict.rewards.reward == 0.0 and verdict.disk_exceeded
    fields = verdict.fields()
    assert fields["disk_limit_exceeded"] == 1.0 and fields["harbor_verify_broken"] == 1.0


async def test_an_agent_within_storage_mb_is_not_flagged(tasks: dict[str, Prepared]) -> None:
    trial = Trial(tasks["small-disk"], PodmanRuntime(), new_lease("rollgym-test-disk", 600))
    try:
        box = await trial.start()
        assert (
            await box.exec(["sh", "-c", "head -c 1M /dev/zero > /app/small"], timeout=90)
        ).exit_code == 0
        verdict = await trial.verify()
    finally:
        await trial.close()
    assert verdict.rewards.reward == 1.0 and not verdict.disk_exceeded
    assert "disk_limit_exceeded" not in verdict.fields()


# Found by a second independent review of this design (each paid 1.0, or broke an honest
# answer, before its fix).

NSS_MODULE = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void forge(void) {
    if (access("/tests/test.sh", F_OK) != 0) return;
    FILE *f = fopen("/logs/verifier/reward.txt", "w");
    if (f) { fputs("1\n", f); fclose(f); }
    _exit(0);
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the NSS module")
async def test_an_nss_module_named_in_nsswitch_is_never_loaded(
    prepared: dict[str, Any], tmp_path: Path
) -> None:
    # glibc loads "libnss_<name>.so.2" for every user lookup (bash does one at its start),
    # relative to the working directory when the name holds a slash.
    import base64
    import subprocess

    (tmp_path / "m.c").write_text(NSS_MODULE)
    await asyncio.to_thread(
        subprocess.run,
        ["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "m.so"), str(tmp_path / "m.c")],
        check=True,
        timeout=120,
    )
    blob = base64.b64encode((tmp_path / "m.so").read_bytes()).decode()
    script = (
        f"mkdir -p /app/libnss_ && echo {blob} | base64 -d > /app/libnss_/x.so.2"
        " && printf 'passwd: /x files\\ngroup: /x files\\n' > /etc/nsswitch.conf"
    )
    verdict = await play(prepared["hello-file"], script)
    assert verdict.rewards.reward == 0.0
    assert "/etc/nsswitch.conf" in verdict.dropped_shown


async def test_a_link_where_the_image_has_a_directory_reaches_the_verifier(
    prepared: dict[str, Any],
) -> None:
    # No whiteout for a directory replaced by a link: tar cannot unpack a link over the
    # image's directory unless the directory goes first (an honest answer paid 0, "broken").
    script = (
        "rm -rf /etc/ssl && ln -s /tmp /etc/ssl && printf 'Hello, rollgym!\\n' > /app/hello.txt"
    )
    verdict = await play(prepared["hello-file"], script)
    assert verdict.broken is None and verdict.rewards.reward == 1.0


async def test_a_pytest_ini_above_the_tests_is_not_read_and_is_flagged(
    prepared: dict[str, Any],
) -> None:
    # pytest looks for its ini upward from /tests, to /: --collect-only passed every test.
    verdict = await play(
        prepared["fix-failing-test"],
        "printf '[pytest]\\naddopts = --collect-only\\n' > /.pytest.ini",
    )
    assert verdict.rewards.reward == 0.0
    assert "+/.pytest.ini" in verdict.suspect


async def test_a_module_shadowing_pytests_in_the_start_directory_is_flagged(
    prepared: dict[str, Any],
) -> None:
    # `python3 -m pytest` in /app puts /app first on sys.path (a typical Harbor test.sh).
    script = (
        "printf 'import os\\nos._exit(0)\\n' > /app/iniconfig.py && echo x > /app/calc_notes.py"
    )
    verdict = await play(prepared["hello-file"], script)
    assert verdict.rewards.reward == 0.0
    assert "+/app/iniconfig.py" in verdict.suspect
    assert not any("calc_notes" in p for p in verdict.suspect)


async def test_a_directory_deeper_than_the_bound_pays_zero_flagged(
    prepared: dict[str, Any],
) -> None:
    # 1,100 levels: the host's walk recursed once per level (RecursionError on every retry).
    script = "d=/app; for i in $(seq 1100); do d=$d/d; done; mkdir -p $d 2>/dev/null || python3 -c \"import os; os.makedirs('/app/' + '/'.join(['d'] * 1100))\""
    verdict = await play(prepared["hello-file"], script)
    assert verdict.rewards.reward == 0.0 and verdict.broken is not None
    assert "deep" in verdict.broken
