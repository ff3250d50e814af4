"""Builds the broker's image and checks that it runs (SPEC S7); `scripts/image-check` runs this, so does CI.

    scripts/image-check [--engine podman|docker] [--base auto|debian|IMAGE] [--run auto|container|chroot]

The engine is podman, else a docker whose daemon answers, else podman installed from the OS packages. The base is
python:3.11-slim when it is here or can be pulled, else a Debian bookworm root made with mmdebstrap (cached under
${HBR_CACHE_DIR:-~/.cache/hermes-bridge-runs}/image). The image runs as containers on the host network where the
machine allows, else as its exported root under chroot with the image's user, workdir, environment and command.
Checks, one line each: the image's config, the simulator from the image, /readyz, a job driven to `completed`
against that simulator, SIGTERM → exit 0 within SHUTDOWN_GRACE while a job runs, a restart on the same /data that
still has both jobs (the running one completed), and compose.yaml. Exit 1 naming the failed check; nothing is left
running.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpformat import HelpFormatter
from imagelib import compose
from imagelib.base import choose_base
from imagelib.checks import create_job, get_job, wait_ok, wait_status
from imagelib.common import CheckFailed, Report, free_port
from imagelib.engine import Engine, ImageConfig, find_engine, host_ca_bundle
from imagelib.launch import Launcher, Proc, choose_launcher

REPO = Path(__file__).resolve().parents[1]
TAG = "localhost/hermes-bridge-runs:check"
GRACE_S = 10  #: SHUTDOWN_GRACE given to the broker: the check waits this long for its exit after SIGTERM
START_S = 90  #: first start of a process from the image (Python imports, the embedded Redis)
JOB_S = 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/image-check", description=__doc__.split("\n")[0], formatter_class=HelpFormatter
    )
    engine = "the container engine (default: podman, else docker, else install podman)"
    parser.add_argument("--engine", choices=["podman", "docker"], help=engine)
    parser.add_argument("--base", default="auto", help="auto, debian, or an image to build on")
    parser.add_argument("--run", default="auto", choices=["auto", "container", "chroot"], help="how to run it")
    args = parser.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)  # so that the cleanup below runs
    report = Report()
    procs: list[Proc] = []
    try:
        with contextlib.ExitStack() as stack:
            engine, config = build(report, args.engine, args.base)
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hbr-image-check-")))
            launcher = choose_launcher(engine, TAG, config, args.run, scratch)
            stack.callback(launcher.close)
            report.ok("runtime", launcher.description)
            try:
                run_checks(report, launcher, procs)
            except CheckFailed:
                show_logs(procs)
                raise
        report.restart_clock()
        report.ok("compose", compose.validate(REPO / "compose.yaml"))
    except CheckFailed as error:
        report.failed(error)
        print(f"image-check: FAILED ({error.check}) after {report.elapsed():.0f} s", flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"image-check: interrupted after {report.elapsed():.0f} s; cleaned up", flush=True)
        return 130
    print(f"image-check: all {report.passed} checks passed in {report.elapsed():.0f} s", flush=True)
    return 0


def build(report: Report, engine_name: str | None, wanted_base: str) -> tuple[Engine, ImageConfig]:
    engine = find_engine(engine_name)
    report.ok("engine", f"{engine.program} {engine.version}" + (" (installed now)" if engine.installed else ""))
    base = choose_base(engine, wanted_base)
    report.ok("base", f"{base.ref}: {base.how}")
    previous = engine.image_id(TAG)
    engine.build(REPO, TAG, base.ref, host_ca_bundle())
    built = engine.image_id(TAG)
    if previous and previous != built:
        engine.remove_image(previous)  # the last check's image, now untagged
    config = engine.inspect(TAG)
    report.ok("build", f"{TAG} on {base.ref}, {config.size_mb:.0f} MB")
    report.ok("config", check_config(config))
    return engine, config


def check_config(config: ImageConfig) -> str:
    """The Dockerfile's promises, read back from the built image."""
    wanted = {
        "user": (config.user, "broker"),
        "volumes": (config.volumes, ["/data"]),
        "ports": (config.ports, ["8080/tcp"]),
        "command": (config.argv(), ["python", "-m", "broker"]),  # exec form: the broker is PID 1 and gets SIGTERM
        "stop signal": (config.stop_signal, "SIGTERM"),
        "DATA_DIR": (config.env.get("DATA_DIR"), "/data"),
    }
    wrong = [f"{name} is {got!r}, want {want!r}" for name, (got, want) in wanted.items() if got != want]
    if wrong:
        raise CheckFailed("config", "; ".join(wrong))
    return f"user broker, workdir {config.workdir}, volume /data, port 8080/tcp, CMD {config.cmd}, SIGTERM"


def run_checks(report: Report, launcher: Launcher, procs: list[Proc]) -> None:
    sim_port, port = free_port(), free_port()
    simulator = launcher.start("simulator", ["python", "-m", "broker.simulator", "--port", str(sim_port)], {})
    procs.append(simulator)
    wait_ok(f"http://127.0.0.1:{sim_port}/health", "simulator", simulator, START_S)
    report.ok("simulator", f"python -m broker.simulator from the image answers /health on :{sim_port}")

    env = {"HOST": "127.0.0.1", "PORT": str(port), "HERMES_URL": f"http://127.0.0.1:{sim_port}"}
    env["SHUTDOWN_GRACE"] = str(GRACE_S * 1000)
    url = f"http://127.0.0.1:{port}"
    broker = launcher.start("broker", None, env)
    procs.append(broker)
    seconds = wait_ok(f"{url}/readyz", "readyz", broker, START_S)
    uid = broker.uid()
    if uid == 0:
        raise CheckFailed("readyz", "the broker runs as root, not as the image's user")
    as_uid = f"uid {uid}" if uid is not None else "its uid not visible here"
    report.ok("readyz", f"200 from {url}/readyz {seconds:.1f} s after the start ({as_uid}, embedded Redis on /data)")

    job = create_job(url, {"input": "hello"}, "job")
    done = wait_status(url, job, "completed", "job", JOB_S)
    report.ok("job", f"{job} completed against the image's simulator (attempts {done.get('attempts')})")

    running = create_job(url, {"input": "sleep:3 hello again"}, "sigterm")
    wait_status(url, running, "running", "sigterm", JOB_S)
    stop_with_sigterm(report, broker, f"with {running} running")

    broker = launcher.start("broker-restarted", None, env)
    procs.append(broker)
    wait_ok(f"{url}/readyz", "restart", broker, START_S)
    kept = get_job(url, job, "restart")
    if kept.get("status") != "completed":
        raise CheckFailed("restart", f"{job} is {kept.get('status')} after the restart, not completed")
    wait_status(url, running, "completed", "restart", JOB_S)
    report.ok("restart", f"same /data: {job} still completed, {running} taken up again and completed")

    stop_with_sigterm(report, broker, "after the restart", quiet=True)
    simulator.terminate()
    simulator.wait(GRACE_S)


def stop_with_sigterm(report: Report, broker: Proc, when: str, quiet: bool = False) -> None:
    started = report.elapsed()
    broker.terminate()
    code = broker.wait(GRACE_S)
    took = report.elapsed() - started
    if code is None:
        raise CheckFailed("sigterm", f"the broker still runs {GRACE_S} s (its SHUTDOWN_GRACE) after SIGTERM {when}")
    if code != 0:
        raise CheckFailed("sigterm", f"the broker exited {code} on SIGTERM {when}, not 0")
    if not quiet:
        report.ok("sigterm", f"exit 0 {took:.1f} s after SIGTERM {when} (SHUTDOWN_GRACE {GRACE_S} s)")


def show_logs(procs: list[Proc]) -> None:
    for proc in procs:
        lines = proc.logs().strip().splitlines()[-12:]
        print(f"      --- the last {len(lines)} lines of {proc.name}:", flush=True)
        for line in lines:
            print(f"      {line[:300]}", flush=True)


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through the cleanup, as Ctrl-C does


if __name__ == "__main__":
    sys.exit(main())
