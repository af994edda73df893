"""A Beam worker pool for tests: SDK harnesses in their own processes, reached over the Fn API,
in a network namespace of their own where the machine allows it, on loopback where it does not.

Flink and Dataflow run Python DoFns in SDK harness processes that talk to the runner over the Fn
API: control, data, state and timers, each a gRPC stream. :func:`worker_pool` starts Beam's own
worker pool (``python -m apache_beam.runners.worker.worker_pool_main``), which starts one harness
process per worker the runner asks for; a job given :meth:`WorkerPool.beam_options` (the
FnApiRunner, ``pipelines/beam/local_runner.py``) or :meth:`WorkerPool.portable_runner_options` (Beam's
job service) runs every DoFn there.

Two modes, one interface:

* ``netns``: the pool runs in a network namespace created here (``ip netns add``), joined to
  this one by a veth pair with an address at each end and with its own loopback up. The runner
  tells each harness to dial it at ``socket.getfqdn()``, so the namespace gets a hosts file
  (``/etc/netns/<name>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``) that maps
  that name to the runner's end of the pair: every byte between runner and harness crosses the
  pair, none takes the shared loopback. Needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN.
* ``loopback``: the pool is a plain local subprocess (non-root CI).

``RENYI_PORTABLE_WORKERS=netns`` or ``=loopback`` forces a mode (``netns`` fails when namespaces
are not allowed); unset, ``netns`` is tried and ``loopback`` taken, with the reason, when it
cannot be set up. Everything started is stopped by process group id and every namespace, veth
and hosts file created is removed when the context exits, also when the test fails; what a
session killed outright left behind is removed by the next one (:func:`_remove_stale_namespaces`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
MODE_VARIABLE = "RENYI_PORTABLE_WORKERS"
MODES = ("netns", "loopback")
# 10.241.0.0/16 in /30 blocks: one block (runner end .1, pool end .2) per namespace.
_SUBNETS = ipaddress.ip_network("10.241.0.0/16")
_READY = re.compile(r"Started worker pool servicer at port: \S+:(\d+)")
_HARNESS_STARTED = "Starting worker with command"
_pools_started = 0


@dataclass(frozen=True)
class WorkerPool:
    """A running worker pool: where the runner reaches it and how it was isolated."""

    mode: str  # "netns" or "loopback"
    address: str  # HOST:PORT of the pool's gRPC service, as the runner dials it
    pid: int  # the pool's process id, also its process group id
    log: Path  # the pool's stdout and stderr
    detail: str  # how it runs, and why this mode (said in the test output)

    def beam_options(self, harnesses: int) -> list[str]:
        """Beam options that run a job's DoFns on ``harnesses`` SDK harnesses of this pool, driven
        by Beam's FnApiRunner in the job's process (``pipelines/beam/local_runner.py``)."""
        if harnesses < 1:
            raise ValueError(f"harnesses must be at least 1, got harnesses={harnesses}")
        return ["--environment_type=EXTERNAL", f"--environment_config={self.address}",
                f"--direct_num_workers={harnesses}"]

    def portable_runner_options(self) -> list[str]:
        """Beam options that submit a job to Beam's own job service over the Job API (Beam's
        PortableRunner, as for Flink's job server), which runs its DoFns on one SDK harness of
        this pool (the job service asks for one harness per environment)."""
        return ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                f"--environment_config={self.address}"]

    def harnesses_started(self) -> int:
        """How many SDK harness processes the pool has started so far (it logs each one)."""
        return self.log.read_text(errors="replace").count(_HARNESS_STARTED)


def requested_mode() -> str | None:
    """The mode ``RENYI_PORTABLE_WORKERS`` forces, or None (try ``netns``, else ``loopback``)."""
    mode = os.environ.get(MODE_VARIABLE, "").strip()
    if mode and mode not in MODES:
        raise ValueError(f"{MODE_VARIABLE} must be one of {', '.join(MODES)} or unset, got {MODE_VARIABLE}={mode}")
    return mode or None


@contextlib.contextmanager
def worker_pool(folder: Path, *, mode: str | None = None, start_timeout: float = 60.0) -> Iterator[WorkerPool]:
    """A worker pool serving SDK harnesses until the context exits (see the module docstring for
    the modes). ``folder`` receives the pool's log. ``mode`` None reads ``RENYI_PORTABLE_WORKERS``."""
    global _pools_started
    mode = mode or requested_mode()
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} or None, got mode={mode!r}")
    _pools_started += 1
    with contextlib.ExitStack() as stack:
        namespace, why_not = None, ""
        if mode in (None, "netns"):
            try:
                namespace = stack.enter_context(_namespace(f"rpw{os.getpid()}-{_pools_started}"))
            except NamespaceRefused as exc:
                if mode == "netns":
                    raise
                why_not = str(exc)
        log = folder / f"worker-pool-{_pools_started}.log"
        prefix = ["ip", "netns", "exec", namespace.name] if namespace else []
        pool = stack.enter_context(_group_process(
            [*prefix, sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", "--service_port=0"],
            log=log, env=harness_env()))
        port = _wait_for_port(pool, log, start_timeout)
        if namespace:
            detail = (f"network namespace {namespace.name}: pool at {namespace.pool_ip}:{port}, harnesses dial the "
                      f"runner as {namespace.runner_name} -> {namespace.runner_ip} over veth {namespace.veth}")
            yield WorkerPool("netns", f"{namespace.pool_ip}:{port}", pool.pid, log, detail)
        else:
            reason = "asked for" if mode == "loopback" else f"no network namespace here: {why_not}"
            yield WorkerPool("loopback", f"localhost:{port}", pool.pid, log,
                             f"loopback: pool at localhost:{port}, a local subprocess ({reason})")


def harness_env() -> dict[str, str]:
    """The environment of the pool and its harnesses: this interpreter first on ``PATH`` (the pool
    starts each harness as ``python -c ...``) and this tree first on ``PYTHONPATH`` (the harnesses
    unpickle the tree's DoFns)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_job(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python <argv>`` from the repository root in its own process group and return its
    output. The whole group is killed when it exits, when the caller is interrupted, and after
    ``timeout`` seconds (then JobTimedOut, with the job's output): a job whose harnesses cannot
    reach it never outlives the test."""
    with _group_process([sys.executable, *argv], env=env or harness_env()) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise JobTimedOut(f"{' '.join(argv[:3])} ... did not finish in {timeout} s; its output:\n"
                              f"{out[-2000:]}\n{err[-4000:]}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class JobTimedOut(AssertionError):
    """A job run by :func:`run_job` did not finish in time (it was killed with its group)."""


@contextlib.contextmanager
def _group_process(argv: Sequence[str], *, env: dict[str, str], log: Path | None = None) -> Iterator[subprocess.Popen]:
    """``argv`` started as the leader of a new process group (its pid is the group id), its output
    to ``log`` or to pipes; on exit the whole group is killed (:func:`_kill_group`)."""
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(log, "wb")) if log is not None else None
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, text=sink is None,
                                stdout=sink or subprocess.PIPE, stderr=subprocess.STDOUT if sink else subprocess.PIPE)
        stack.enter_context(proc)  # closes the pipes and reaps it last
        stack.callback(_kill_group, proc)
        yield proc


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group (``proc`` and every process it started that did not
    leave the group, even after ``proc`` exited), SIGKILL to what is left after 5 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader: an unreaped leader keeps the group alive
        if not _group_alive(proc.pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5.0)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for_port(proc: subprocess.Popen, log: Path, timeout: float) -> int:
    """The port the pool listens on, from its log line, once it has started serving."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = _READY.search(log.read_text(errors="replace"))
        if match:
            return int(match.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"the worker pool exited with status {proc.returncode} before serving:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"the worker pool did not serve within {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


# --- the network namespace ------------------------------------------------------------------------


class NamespaceRefused(RuntimeError):
    """This machine does not let the test create a network namespace (not root, no ``ip``, ...)."""


@dataclass(frozen=True)
class Namespace:
    name: str
    veth: str  # the runner's end; the pool's end is inside the namespace
    runner_ip: str
    pool_ip: str
    runner_name: str  # what the harnesses dial: the runner's socket.getfqdn()


@contextlib.contextmanager
def _namespace(name: str) -> Iterator[Namespace]:
    """A network namespace ``name`` joined to this one by a veth pair (runner end ``.1``, pool end
    ``.2`` of a free /30), loopback up, and a hosts file mapping this machine's ``getfqdn()`` to
    the runner end. NamespaceRefused when any step is not allowed; whatever was created is
    removed on exit and on failure."""
    ip = shutil.which("ip")
    if ip is None:
        raise NamespaceRefused("the ip command (iproute2) is not installed")
    if os.geteuid() != 0:
        raise NamespaceRefused(f"not root (uid {os.geteuid()}): ip netns add needs CAP_SYS_ADMIN and CAP_NET_ADMIN")
    _remove_stale_namespaces(ip)
    host_end, pool_end = f"{name}h", f"{name}n"
    etc = Path("/etc/netns")
    created_etc = not etc.exists()
    with contextlib.ExitStack() as undo:
        _ip(ip, "netns", "add", name)
        undo.callback(_quiet, ip, "netns", "delete", name)  # also destroys the pair (its inner end lives there)
        _ip(ip, "link", "add", host_end, "type", "veth", "peer", "name", pool_end)
        undo.callback(_quiet, ip, "link", "delete", host_end)
        _ip(ip, "link", "set", pool_end, "netns", name)
        block = _free_block(ip)
        runner_ip, pool_ip = str(block[1]), str(block[2])
        _ip(ip, "addr", "add", f"{runner_ip}/{block.prefixlen}", "dev", host_end)
        _ip(ip, "link", "set", host_end, "up")
        _ip(ip, "-n", name, "addr", "add", f"{pool_ip}/{block.prefixlen}", "dev", pool_end)
        _ip(ip, "-n", name, "link", "set", pool_end, "up")
        _ip(ip, "-n", name, "link", "set", "lo", "up")
        runner_name = socket.getfqdn()
        hosts = etc / name / "hosts"
        try:
            hosts.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise NamespaceRefused(f"cannot create {hosts.parent}: {exc}") from None
        undo.callback(_remove_hosts, hosts.parent, etc if created_etc else None)
        # The runner names itself getfqdn() to the harnesses (Beam's ExternalWorkerHandler); here
        # that name must lead to the runner's end of the pair, even when it is "localhost".
        lines = [f"{runner_ip} {runner_name}"] + (["127.0.0.1 localhost"] if runner_name != "localhost" else [])
        hosts.write_text("\n".join(lines) + "\n")
        _reach_runner(ip, name, runner_name, runner_ip)
        yield Namespace(name, host_end, runner_ip, pool_ip, runner_name)


def _reach_runner(ip: str, name: str, runner_name: str, runner_ip: str) -> None:
    """NamespaceRefused unless a process in namespace ``name`` (``ip netns exec``, which needs a
    mount namespace too) opens a TCP connection to ``runner_name`` and arrives at ``runner_ip``:
    the hosts file, the pair and the routes work, and no firewall drops the pair's traffic (a
    pool that cannot reach the runner would hang the jobs instead)."""
    with socket.create_server((runner_ip, 0)) as server:
        server.settimeout(0.1)
        dial = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"
        with subprocess.Popen([ip, "netns", "exec", name, sys.executable, "-c", dial, runner_name,
                               str(server.getsockname()[1])], stderr=subprocess.PIPE, text=True) as probe:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                gone = probe.poll() is not None  # before accept: a connection it made before exiting is queued
                try:
                    server.accept()[0].close()
                except socket.timeout:
                    if gone:  # it gave up (or never ran): nothing will arrive
                        break
                    continue
                if probe.wait(timeout=10.0) == 0:
                    return
                break
            probe.kill()
            said = probe.communicate()[1].strip().splitlines()
            raise NamespaceRefused(f"a process in {name} (ip netns exec) cannot reach {runner_name} at {runner_ip}: "
                                   f"{said[-1] if said else 'no connection in 10 s'}")


def _remove_stale_namespaces(ip: str) -> None:
    """Remove what this helper left behind in a session that died without its cleanup (a test
    process killed with SIGKILL): namespaces named ``rpw<pid>-<n>`` whose process ``pid`` is gone,
    with the processes still in them (its pools and their harnesses), their pair and hosts file."""
    for match in re.finditer(r"^(rpw(\d+)-\d+)\b", _ip(ip, "netns", "list"), flags=re.MULTILINE):
        name, pid = match.group(1), int(match.group(2))
        try:
            os.kill(pid, 0)
            continue  # that session is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # a live process of another user
        for stale in re.findall(r"\d+", subprocess.run([ip, "netns", "pids", name], capture_output=True,
                                                        text=True).stdout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stale), signal.SIGKILL)
        _quiet(ip, "netns", "delete", name)
        _quiet(ip, "link", "delete", f"{name}h")
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


def _free_block(ip: str) -> ipaddress.IPv4Network:
    """A /30 of 10.241.0.0/16 no interface here has an address in, starting at one picked by pid
    (tests of other processes may hold namespaces at the same time)."""
    used = {ipaddress.ip_interface(a).ip for a in re.findall(r"inet (\S+)", _ip(ip, "-4", "-o", "addr", "show"))}
    blocks = list(_SUBNETS.subnets(new_prefix=30))
    start = (os.getpid() * 7 + _pools_started) % len(blocks)
    for block in blocks[start:] + blocks[:start]:
        if not any(address in block for address in used):
            return block
    raise NamespaceRefused(f"no free /30 block in {_SUBNETS}")


def _ip(ip: str, *args: str) -> str:
    done = subprocess.run([ip, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NamespaceRefused(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _quiet(ip: str, *args: str) -> None:
    subprocess.run([ip, *args], capture_output=True)


def _remove_hosts(folder: Path, etc: Path | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    if etc is not None:
        with contextlib.suppress(OSError):
            etc.rmdir()  # only if this created it and it is empty
