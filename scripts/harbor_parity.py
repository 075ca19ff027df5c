"""Run rollgym's bundled Harbor tasks under Harbor's own runner and under rollgym, and print
each task's reward side by side (oracle and nop agents), with whether the two agree.

Harbor is not a dependency of rollgym: install it in a separate Python 3.12 venv, with
podman-compose (Harbor's podman environment drives it), and pass that venv's ``harbor``:

    ~/.pyenv/versions/3.12.1/bin/python -m venv /tmp/harbor-venv
    /tmp/harbor-venv/bin/pip install harbor==0.25.0 podman-compose
    PYTHONPATH=$PWD/src .venv/bin/python scripts/harbor_parity.py \\
        --harbor /tmp/harbor-venv/bin/harbor

What it does, in a new work directory (kept; its path is printed):

1. copies examples/harbor-tasks and points each Dockerfile's ``FROM debian:bookworm`` at
   rollgym's local base image (no registry is reachable here; rollgym maps that FROM to the same
   image itself), which it builds first if missing (``ensure_base()``);
2. writes a containers.conf naming the OCI runtime and the nofile/nproc ulimits and points
   ``CONTAINERS_CONF`` at it for Harbor's processes only: podman-compose calls plain ``podman``,
   whose default runtime (crun) and default rlimits fail on this host;
3. runs ``harbor run -p TASKS -a AGENT -e podman -n 1`` per agent and reads each trial's
   ``result.json`` in Harbor's job directory (its rewards, or its exception);
4. runs ``python -m rollgym run examples/harbor-tasks --agent AGENT`` and reads rollouts.jsonl
   and failures.jsonl;
5. removes what Harbor's runs left in podman (containers and networks named after a trial's
   compose project, ``hb__*`` images that were not there before) and prints the table.

Exit status: 0 all agree, 1 some task disagrees, 2 it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "harbor-tasks"
AGENTS = ("oracle", "nop")
FROM_LINE = re.compile(r"^(\s*FROM\s+)debian:bookworm(\s|$)", re.IGNORECASE | re.MULTILINE)
REMOVE = {
    "container": ["podman", "rm", "-f"],
    "network": ["podman", "network", "rm"],
    "image": ["podman", "rmi"],
}
ANY_FROM = re.compile(r"^\s*FROM\s.*$", re.IGNORECASE | re.MULTILINE)

Rewards = dict[str, float]
# One cell: the rewards of a trial, or the error that left it without any.
Cell = Rewards | str


class SetupError(Exception):
    """The comparison could not run (a tool missing, a run that did not finish)."""


def run(
    argv: list[str], *, timeout: float, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` in its own process group, killed whole at ``timeout``: Harbor and rollgym both
    start podman children that a plain kill of the parent would leave running."""
    out = log.open("w") if log else subprocess.PIPE
    try:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            where = f" (output in {log})" if log else ""
            raise SetupError(f"{argv[0]} did not finish in {timeout:.0f} s{where}") from None
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    return subprocess.CompletedProcess(argv, proc.returncode, stdout or "", "")


def podman_names(kind: str) -> set[str]:
    """Names (images: repository:tag) of one kind of podman object on this host."""
    fmt = {"image": "{{.Repository}}:{{.Tag}}", "container": "{{.Names}}"}.get(kind, "{{.Name}}")
    argv = ["podman", kind, "ls", "--format", fmt]
    if kind == "container":
        argv.insert(3, "--all")
    done = run(argv, timeout=60)
    if done.returncode != 0:
        raise SetupError(f"{' '.join(argv)} failed: {done.stdout.strip()}")
    return set(done.stdout.split())


def rollgym_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def base_image(python: str) -> str:
    code = "from rollgym.containers.images import ensure_base; print(ensure_base())"
    done = run([python, "-c", code], timeout=1800, env=rollgym_env())
    if done.returncode != 0:
        raise SetupError(f"rollgym's base image could not be built: {done.stdout.strip()}")
    return done.stdout.strip().splitlines()[-1]


def copy_tasks(tasks: Path, dest: Path, image: str) -> list[str]:
    """Copy the task directories to ``dest`` with ``FROM debian:bookworm`` pointed at
    ``image``; the task names. A FROM this cannot point anywhere local is an error."""
    shutil.copytree(tasks, dest)
    names = []
    for dockerfile in sorted(dest.glob("*/environment/Dockerfile")):
        text = FROM_LINE.sub(lambda m: f"{m[1]}{image}{m[2]}", dockerfile.read_text())
        other = [line for line in ANY_FROM.findall(text) if image not in line]
        if other:
            raise SetupError(f"{dockerfile}: FROM with no local image here: {other}")
        dockerfile.write_text(text)
        names.append(dockerfile.parents[1].name)
    return names


def write_containers_conf(path: Path, runtime: str, nofile: int, nproc: int) -> None:
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        f'runtime = "{runtime}"\n'
    )


def harbor_env(harbor: Path, conf: Path) -> dict[str, str]:
    return {
        **os.environ,
        # podman-compose from the same venv as harbor; Harbor finds it on PATH.
        "PATH": f"{harbor.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CONTAINERS_CONF": str(conf),
        # LiteLLM (imported by Harbor) otherwise tries to fetch its price list, and waits.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def run_harbor(
    harbor: Path, tasks: Path, agent: str, jobs: Path, env: dict[str, str], timeout: float
) -> tuple[dict[str, Cell], list[str]]:
    """Harbor's runner over ``tasks`` with ``agent``: each task's cell and the compose project
    names of its trials (what its containers and networks are named after)."""
    # One trial at a time: Harbor names a task's image after its environment's content, so
    # hello-file and greet-script (the same Dockerfile) share one, and a trial's `compose down
    # --rmi local` can remove it under the other when they overlap.
    argv = [
        str(harbor), "run", "-p", str(tasks), "-a", agent, "-e", "podman",
        "-o", str(jobs), "--job-name", agent, "-n", "1", "-y", "-q",
    ]  # fmt: skip
    log = jobs.parent / f"harbor-{agent}.log"
    done = run(argv, timeout=timeout, env=env, log=log)
    job = jobs / agent
    cells: dict[str, Cell] = {}
    projects = []
    for result in sorted(job.glob("*/result.json")):
        trial = json.loads(result.read_text())
        projects.append(re.sub(r"[^a-z0-9_-]", "-", trial["trial_name"].lower()) + "__env")
        exc = trial.get("exception_info")
        rewards = (trial.get("verifier_result") or {}).get("rewards")
        if exc:
            cells[trial["task_name"]] = (
                f"{exc.get('exception_type')}: {exc.get('exception_message', '')[:120]}"
            )
        elif rewards is None:
            cells[trial["task_name"]] = "no reward"
        else:
            cells[trial["task_name"]] = {k: float(v) for k, v in rewards.items()}
    if not cells:
        raise SetupError(f"harbor run exited {done.returncode} with no trial results (see {log})")
    return cells, projects


def run_rollgym(python: str, tasks: Path, agent: str, out: Path, timeout: float) -> dict[str, Cell]:
    argv = [python, "-m", "rollgym", "run", str(tasks), "--agent", agent, "-o", str(out),
            "--no-progress"]  # fmt: skip
    log = out.parent / f"rollgym-{agent}.log"
    done = run(argv, timeout=timeout, env=rollgym_env(), log=log)
    if done.returncode not in (0, 1):  # 1: the run completed, some rollouts failed
        raise SetupError(f"rollgym run exited {done.returncode} (see {log})")
    cells: dict[str, Cell] = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        cells[row["harbor_task"]] = {k: float(v) for k, v in row["harbor_rewards"].items()}
    names = [json.loads(line)["harbor"]["task"] for line in (out / "tasks.jsonl").open()]
    for line in (out / "failures.jsonl").read_text().splitlines():
        row = json.loads(line)
        error = row.get("error") or {}
        cells[names[row["task_index"]]] = f"{error.get('type')}: {str(error.get('message'))[:120]}"
    return cells


def clean_up(before: dict[str, set[str]], projects: list[str]) -> list[str]:
    """Remove the podman objects Harbor's trials made and left (it removes its own on success;
    a trial cut short may not): only new ones, only by Harbor's names. What was removed."""
    removed = []
    for kind in ("container", "network", "image"):
        for name in sorted(podman_names(kind) - before[kind]):
            repo = name.rsplit(":", 1)[0].removeprefix("localhost/")
            ours = repo.startswith("hb__") if kind == "image" else name.startswith(tuple(projects))
            if not ours:
                continue
            argv = [*REMOVE[kind], name]
            if run(argv, timeout=120).returncode == 0:
                removed.append(f"{kind} {name}")
    return removed


def cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "missing"
    if isinstance(cell, str):
        return cell
    extra = ", ".join(f"`{k}` {v:g}" for k, v in cell.items() if k != "reward")
    reward = f"{cell['reward']:.1f}" if "reward" in cell else "no `reward`"
    return f"{reward} ({extra})" if extra else reward


def table(tasks: list[str], cells: dict[tuple[str, str], dict[str, Cell]]) -> tuple[str, bool]:
    head = "| task | Harbor oracle | rollgym oracle | Harbor nop | rollgym nop | agree |"
    lines = [head, "|---|---|---|---|---|---|"]
    all_agree = True
    for task in tasks:
        row = []
        agree = True
        for agent in AGENTS:
            h, r = cells[("harbor", agent)].get(task), cells[("rollgym", agent)].get(task)
            row += [cell_text(h), cell_text(r)]
            # Errors never agree: the comparison is of rewards.
            agree &= isinstance(h, dict) and h == r
        all_agree &= agree
        lines.append(f"| {task} | {' | '.join(row)} | {'yes' if agree else 'NO'} |")
    return "\n".join(lines), all_agree


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--harbor",
        type=Path,
        required=True,
        help="the harbor CLI of a venv with harbor==0.25.0 and podman-compose",
    )
    parser.add_argument(
        "--tasks", type=Path, default=TASKS, help="task directories (default: %(default)s)"
    )
    parser.add_argument(
        "--work", type=Path, help="work directory, new or empty (default: a new temp dir)"
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="Python that runs rollgym, with this checkout's src on PYTHONPATH (default: this one)",
    )
    parser.add_argument(
        "--runtime", default="runc", help="OCI runtime for Harbor's podman (default: runc)"
    )
    parser.add_argument(
        "--nofile", type=int, default=20000, help="RLIMIT_NOFILE in Harbor's containers"
    )
    parser.add_argument(
        "--nproc", type=int, default=4096, help="RLIMIT_NPROC in Harbor's containers"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds for each harbor run and each rollgym run (default: 1800)",
    )
    parser.add_argument("--json", type=Path, help="also write every cell to this file")
    parser.add_argument(
        "--base",
        help="point Harbor's FROM debian:bookworm at this local image instead of rollgym's base "
        "image: e.g. a plain `mmdebstrap --variant=minbase bookworm` import, what the "
        "registry's debian:bookworm is, to check the tasks install what their tests need "
        "(rollgym's own run is unchanged: it maps the FROM itself)",
    )
    args = parser.parse_args()
    try:
        return compare(args)
    except SetupError as exc:
        print(f"harbor_parity: {exc}", file=sys.stderr)
        return 2


def compare(args: argparse.Namespace) -> int:
    harbor = args.harbor.absolute()
    if not (harbor.is_file() and os.access(harbor, os.X_OK)):
        raise SetupError(
            f"no harbor CLI at {harbor}: pip install harbor==0.25.0 in a venv, pass its bin/harbor"
        )
    if shutil.which("podman") is None:
        raise SetupError("podman is not on PATH")
    work = (args.work or Path(tempfile.mkdtemp(prefix="harbor-parity-"))).absolute()
    conf = work / "containers.conf"
    env = harbor_env(harbor, conf)
    if shutil.which("podman-compose", path=env["PATH"]) is None:
        raise SetupError(
            f"no podman-compose beside {harbor} nor on PATH: pip install it in harbor's venv"
        )
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        raise SetupError(f"{work} is not empty")
    print(f"work directory: {work}", flush=True)
    write_containers_conf(conf, args.runtime, args.nofile, args.nproc)
    image = args.base or base_image(args.python)
    names = copy_tasks(args.tasks, work / "tasks", image)
    print(f"{len(names)} tasks, FROM debian:bookworm -> {image}", flush=True)

    before = {kind: podman_names(kind) for kind in ("container", "network", "image")}
    cells: dict[tuple[str, str], dict[str, Cell]] = {}
    projects: list[str] = []
    try:
        for agent in AGENTS:
            print(f"harbor run -a {agent} ...", flush=True)
            cells[("harbor", agent)], made = run_harbor(
                harbor, work / "tasks", agent, work / "jobs", env, args.timeout
            )
            projects += made
    finally:
        for line in clean_up(before, projects):
            print(f"removed {line}")
    for agent in AGENTS:
        print(f"rollgym run --agent {agent} ...", flush=True)
        cells[("rollgym", agent)] = run_rollgym(
            args.python, args.tasks.absolute(), agent, work / f"rollgym-{agent}", args.timeout
        )
    text, agree = table(names, cells)
    print(text)
    print("Harbor and rollgym agree on every task." if agree else "They DISAGREE (see NO above).")
    if args.json:
        flat = {f"{side} {agent}": c for (side, agent), c in cells.items()}
        args.json.write_text(json.dumps(flat, indent=1, sort_keys=True))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
