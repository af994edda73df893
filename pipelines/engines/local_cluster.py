"""A local Flink cluster with its PyFlink workers' environment, a Beam Python worker pool and a Kafka
broker, started with one command.

    python -m renyi_stream.pipelines.engines.local_cluster up       # fetch what is missing, start, wait until ready
    python -m renyi_stream.pipelines.engines.local_cluster status   # each process, and the Beam options to use
    python -m renyi_stream.pipelines.engines.local_cluster down     # stop exactly the processes `up` started

Everything fetched goes into one cache folder (``$RENYI_ENGINES_CACHE``, default
``~/.cache/renyi-stream/engines``): Flink's runtime and scripts unpacked from PyPI's
``apache-flink-libraries`` sdist and ``apache-flink`` wheel, Flink's Kafka connector in its
``lib/``, the PyFlink workers' Python environment (``pip install '<project>[flink]'``,
:mod:`.worker_env`), Beam's Flink job server and Java IO expansion service at the installed
apache-beam's version, and a Kafka broker with its runtime dependencies from Maven Central. Once
cached nothing is fetched again. Logs, configuration, checkpoints, Kafka's data and the state file
(every process id started) are in the run folder (``$RENYI_ENGINES_RUN``, default ``<cache>/run``).
deploy/README.md, "Try the Flink deployment on one machine", says how to use it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from renyi_stream.pipelines.engines import worker_env
from renyi_stream.pipelines.engines.errors import ClusterError
from renyi_stream.pipelines.engines.worker_env import WorkerEnv

ROOT = Path(__file__).resolve().parents[2]  # the project, importable by the worker pool's harnesses
CACHE_VARIABLE = "RENYI_ENGINES_CACHE"
RUN_VARIABLE = "RENYI_ENGINES_RUN"
FLINK_VERSION = "2.2.0"
#: Flink version -> (``flink-connector-kafka`` version, ``kafka-clients`` version) for its ``lib/``.
FLINK_RELEASES = {"2.2.0": ("5.0.0-2.2", "4.2.0"), "1.20.5": ("3.4.0-1.20", "3.4.0")}
KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"  # the Log4j 2 of Kafka 4.1's own dependencies
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
#: What Beam's job server JVM needs on Java 17 (Beam's own flink_runner_test.py passes these).
JOB_SERVER_JVM = ("--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/java.nio=ALL-UNNAMED",
                  "--add-opens=java.base/java.util=ALL-UNNAMED")
#: How long a missing Maven artifact is believed missing before it is asked for again.
RETRY_MISSING_S = 24 * 3600
STATE_FILE = "cluster.json"


@dataclass(frozen=True)
class Ports:
    """Ports on localhost: chosen off the usual defaults (8081, 9092, 50000) so as not to clash."""

    rest: int = 18081  # Flink's REST API and web UI: --flink_master=localhost:<rest>
    rpc: int = 16123  # the JobManager's RPC
    pool: int = 15000  # Beam's Python worker pool: --environment_config=localhost:<pool>
    kafka: int = 19092  # the broker
    controller: int = 19093  # the KRaft controller


@dataclass(frozen=True)
class Config:
    cache: Path
    run: Path
    ports: Ports = Ports()
    flink_version: str = FLINK_VERSION
    kafka_version: str = KAFKA_VERSION
    beam_version: str = ""
    taskmanagers: int = 2
    slots: int = 2
    python: str = sys.executable  # the interpreter the PyFlink workers' environment is made with
    worker_env: bool = True  # build that environment and point python.executable at it

    def __post_init__(self) -> None:
        if self.flink_version not in FLINK_RELEASES:
            raise ValueError(f"flink_version must be one of {', '.join(sorted(FLINK_RELEASES))}, "
                             f"got flink_version={self.flink_version!r}")

    @classmethod
    def default(cls, *, cache: str | Path | None = None, run: str | Path | None = None, **kwargs) -> "Config":
        cache = Path(cache or os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "renyi-stream" / "engines")
        run = Path(run or os.environ.get(RUN_VARIABLE) or cache / "run")
        if not kwargs.get("beam_version"):
            from apache_beam.version import __version__ as beam_version

            kwargs["beam_version"] = beam_version
        return cls(cache=cache.expanduser().absolute(), run=run.expanduser().absolute(), **kwargs)

    @property
    def flink_home(self) -> Path:
        return self.cache / f"flink-{self.flink_version}"

    @property
    def beam_jars(self) -> Path:
        return self.cache / f"beam-{self.beam_version}"

    @property
    def kafka_libs(self) -> Path:
        return self.cache / f"kafka-{self.kafka_version}" / "libs"

    @property
    def flink_minor(self) -> str:
        return ".".join(self.flink_version.split(".")[:2])

    def kafka_connector_coordinates(self) -> tuple[str, str]:
        """Maven coordinates of Flink's Kafka connector and the ``kafka-clients`` it was built for."""
        connector, clients = FLINK_RELEASES[self.flink_version]
        return f"org.apache.flink:flink-connector-kafka:{connector}", f"org.apache.kafka:kafka-clients:{clients}"

    def beam_coordinates(self) -> dict[str, str]:
        """``name -> Maven coordinates`` of Beam's two jars at the installed Python SDK's version."""
        return {"job_server": f"org.apache.beam:beam-runners-flink-{self.flink_minor}-job-server:{self.beam_version}",
                "expansion_service": f"org.apache.beam:beam-sdks-java-io-expansion-service:{self.beam_version}"}


def _say(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


# --- fetching ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifacts:
    """What the cache holds: Flink's home, Kafka's jars, Beam's jars (None: not served; ``missing``
    says which coordinates and why), the PyFlink workers' environment (None: not asked for)."""

    flink_home: Path
    kafka_libs: Path
    job_server_jar: Path | None
    expansion_service_jar: Path | None
    missing: dict[str, str] = field(default_factory=dict)
    worker_env: WorkerEnv | None = None


def fetch(config: Config, *, retry_missing: bool = False) -> Artifacts:
    """Fetch into the cache whatever it lacks (idempotent; offline once everything is cached)."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise ClusterError(f"{tool} is not on PATH: install Java 17 and Maven (Debian: apt-get install "
                               "openjdk-17-jdk-headless maven)")
    config.cache.mkdir(parents=True, exist_ok=True)
    flink = _flink_home(config)
    _flink_lib_extras(config, flink)
    kafka = _kafka_libs(config)
    jars, missing = {}, {}
    for name, coordinates in config.beam_coordinates().items():
        jars[name], why = _maven_jar(config, coordinates, retry_missing=retry_missing)
        if jars[name] is None:
            missing[coordinates] = why
    env = worker_env.ensure(config.cache, flink_version=config.flink_version, python=config.python, project=ROOT,
                            say=_say) if config.worker_env else None
    return Artifacts(flink, kafka, jars["job_server"], jars["expansion_service"], missing, env)


def _timed(what: str, action: Callable[[], None]) -> None:
    _say(f"{what} ...")
    started = time.monotonic()
    action()
    _say(f"{what}: done in {time.monotonic() - started:.0f} s")


def _run(cmd: Sequence[str], *, what: str, quiet: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(list(cmd), cwd=cwd, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE if quiet else None)
    if done.returncode != 0 and not quiet:
        raise ClusterError(f"{what} failed (exit status {done.returncode}): {' '.join(cmd)}")
    return done


def _flink_home(config: Config) -> Path:
    """Flink's home assembled from PyPI: ``lib/ opt/ plugins/`` and ``bin/bash-java-utils.jar`` from
    the ``apache-flink-libraries`` sdist, ``bin/ conf/`` from the ``apache-flink`` wheel."""
    home, version = config.flink_home, config.flink_version
    if (home / ".complete").exists():
        return home
    downloads = config.cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    sdist = downloads / f"apache_flink_libraries-{version}.tar.gz"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(downloads)]
    if not sdist.exists():
        _timed(f"downloading apache-flink-libraries=={version} from PyPI (about 230 MB)",
               lambda: _run([*pip, "--no-binary", ":all:",
                             f"apache-flink-libraries=={version}"], what="pip download"))
    wheels = sorted(downloads.glob(f"apache_flink-{version}-*.whl"))
    if not wheels:
        _timed(f"downloading apache-flink=={version} (its wheel: Flink's scripts and configuration)",
               lambda: _run([*pip, "--only-binary", ":all:", f"apache-flink=={version}"], what="pip download"))
        wheels = sorted(downloads.glob(f"apache_flink-{version}-*.whl"))
    staging = home.with_name(home.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)

    def unpack() -> None:
        prefix = f"apache_flink_libraries-{version}/deps/"
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                if member.name.startswith(prefix) and len(member.name) > len(prefix):
                    member.name = member.name[len(prefix):]
                    tar.extract(member, staging, filter="data")
        with zipfile.ZipFile(wheels[0]) as whl:
            for name in whl.namelist():
                part = name.split("/", 1)
                if name.startswith(("pyflink/bin/", "pyflink/conf/")) and not name.endswith((".bat", "/")):
                    target = staging / part[1]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(whl.read(name))
                    if name.startswith("pyflink/bin/"):
                        target.chmod(0o755)
        if not (staging / "bin" / "jobmanager.sh").exists() or not list((staging / "lib").glob("flink-dist-*.jar")):
            raise ClusterError(f"the PyPI artifacts of Flink {version} did not hold bin/jobmanager.sh and lib/flink-dist")
        shutil.rmtree(home, ignore_errors=True)
        staging.rename(home)
        (home / ".complete").write_text(version + "\n")

    _timed(f"unpacking Flink {version} into {home}", unpack)
    return home


def _flink_lib_extras(config: Config, home: Path) -> list[Path]:
    """Put in Flink's ``lib/`` what PyFlink jobs reading Kafka need on every TaskManager's
    classpath: ``flink-python`` (copied from ``opt/``, which keeps exactly one for ``flink run
    -py``) and the Kafka connector with its ``kafka-clients``. In ``lib/`` and not added per job,
    they are loaded once: per-job jars grew the TaskManagers' metaspace by about 35 MB a job."""
    marker = home / ".lib-extras"
    if marker.exists():
        return [home / "lib" / name for name in marker.read_text().split()]
    python_jars = sorted((home / "opt").glob("flink-python*.jar"))
    if len(python_jars) != 1:
        raise ClusterError(f"{home / 'opt'} must hold exactly one flink-python*.jar (flink run -py looks there), "
                           f"found {[p.name for p in python_jars]}")
    shutil.copy(python_jars[0], home / "lib" / python_jars[0].name)
    added = [home / "lib" / python_jars[0].name]
    for coordinates in config.kafka_connector_coordinates():
        _, artifact, version = coordinates.split(":")
        _say(f"fetching {coordinates} from Maven Central into {home / 'lib'} ...")
        done = _maven(config, f"{DEPENDENCY_PLUGIN}:copy", f"-Dartifact={coordinates}",
                      f"-DoutputDirectory={home / 'lib'}")
        jar = home / "lib" / f"{artifact}-{version}.jar"
        if done.returncode != 0 or not jar.exists():
            raise ClusterError(f"Maven could not fetch {coordinates} (flink_version={config.flink_version!r}): "
                               f"{_maven_error(done)}")
        added.append(jar)
    marker.write_text("\n".join(p.name for p in added) + "\n")
    return added


def _maven(config: Config, *args: str, quiet: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # Maven's own repository inside the cache: one folder holds everything fetched.
    return _run(["mvn", "-B", "-ntp", f"-Dmaven.repo.local={config.cache / 'm2'}", *args], what="mvn",
                quiet=quiet, cwd=cwd)


def _kafka_libs(config: Config) -> Path:
    """Kafka's broker (``kafka_2.13``) and tools with their runtime dependencies, from Maven Central."""
    libs = config.kafka_libs
    if (libs.parent / ".complete").exists():
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    deps = "".join(f"<dependency><groupId>org.apache.kafka</groupId><artifactId>{a}</artifactId>"
                   f"<version>{config.kafka_version}</version></dependency>" for a in ("kafka_2.13", "kafka-tools"))
    # Kafka's distribution binds its SLF4J 1.7 logging to Log4j 2 with this jar; its poms do not.
    deps += ("<dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>"
             f"<version>{LOG4J_VERSION}</version></dependency>")
    (libs.parent / "pom.xml").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>local.renyi-stream</groupId><artifactId>kafka-broker</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>\n")

    def copy() -> None:
        shutil.rmtree(libs, ignore_errors=True)
        done = _maven(config, f"{DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
                      f"-DoutputDirectory={libs}", cwd=libs.parent)
        if done.returncode != 0:
            raise ClusterError(f"Maven could not fetch Kafka {config.kafka_version}: {_maven_error(done)}")
        (libs.parent / ".complete").write_text(config.kafka_version + "\n")

    _timed(f"fetching Kafka {config.kafka_version} and its runtime dependencies from Maven Central", copy)
    return libs


def _maven_error(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "[ERROR]" in line]
    return (lines[0] if lines else (done.stdout + done.stderr)[-500:]).replace("[ERROR] ", "").strip()


def _maven_jar(config: Config, coordinates: str, *, retry_missing: bool) -> tuple[Path | None, str]:
    """The jar of ``coordinates`` in the cache, fetched from Maven Central if needed; ``(None,
    why)`` when the registry does not serve it (remembered for a day, so ``up`` stays offline)."""
    _, artifact, version = coordinates.split(":")
    jar = config.beam_jars / f"{artifact}-{version}.jar"
    if jar.exists():
        return jar, ""
    missing = config.beam_jars / f"{artifact}-{version}.missing.json"
    if missing.exists() and not retry_missing:
        known = json.loads(missing.read_text())
        if time.time() - known["checked"] < RETRY_MISSING_S:
            return None, known["why"]
    config.beam_jars.mkdir(parents=True, exist_ok=True)
    _say(f"fetching {coordinates} from Maven Central ...")
    # -U: ask the registry again rather than repeat Maven's own cached "not found".
    done = _maven(config, "-U", f"{DEPENDENCY_PLUGIN}:copy", f"-Dartifact={coordinates}",
                  f"-DoutputDirectory={config.beam_jars}")
    if done.returncode == 0 and jar.exists():
        missing.unlink(missing_ok=True)
        _say(f"fetched {jar.name} ({jar.stat().st_size / 2**20:.0f} MB)")
        return jar, ""
    error = _maven_error(done)
    checked = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    why = (f"Maven Central does not serve {coordinates} (asked {checked}; `fetch --retry-missing` asks again)"
           if "Could not find artifact" in error or "was not found" in error else
           f"Maven could not fetch {coordinates}: {error}")
    missing.write_text(json.dumps({"checked": time.time(), "why": why}))
    _say(why)
    return None, why


# --- processes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    name: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat's start time: a reused pid is not ours
    log: str


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, process group, start time)`` of ``pid`` from /proc, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[2]), int(fields[19])


def _alive(service: Service) -> bool:
    stat = _stat(service.pid)
    return stat is not None and stat[0] != "Z" and stat[2] == service.start_ticks


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _group_members(groups: set[int]) -> list[int]:
    """Live processes whose process group is one of ``groups`` (the ones we started lead them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] != "Z" and stat[1] in groups:
                found.append(int(entry.name))
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return not _port_open(port)


class LocalCluster:
    """The cluster of one run folder: start it (:meth:`up`), stop it (:meth:`down`), ask it (:meth:`status`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_path = config.run / STATE_FILE

    # --- state ---

    def _state(self) -> dict:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else {}

    def project(self) -> str | None:
        """The checkout whose code the worker pool runs (the one that started the cluster)."""
        return self._state().get("project")

    def services(self) -> list[Service]:
        return [Service(**s) for s in self._state().get("services", [])]

    def _record(self, **updates) -> None:
        state = {**self._state(), **updates}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, default=str))
        tmp.replace(self.state_path)

    def _add(self, service: Service) -> None:
        self._record(services=[asdict(s) for s in self.services()] + [asdict(service)])

    # --- up ---

    def up(self, *, timeout_s: float = 180.0) -> dict:
        """Fetch what is missing, start every process, wait until each is ready; the state.
        Already up: nothing is started. Whatever fails, what this call started is stopped."""
        services = self.services()
        if services and all(_alive(s) for s in services):
            _say(f"already up ({self.state_path})")
            return self._state()
        if services:
            _say("some processes of the previous start are gone: stopping the rest first")
            self.down()
        artifacts = fetch(self.config)
        ports = self.config.ports
        busy = [f"{name} {port}" for name, port in asdict(ports).items() if not _port_free(port)]
        if busy:
            raise ClusterError(f"ports in use on localhost: {', '.join(busy)} (another cluster? choose others: "
                               "--rest-port, --rpc-port, --pool-port, --kafka-port, --controller-port)")
        self.config.run.mkdir(parents=True, exist_ok=True)
        (self.config.run / "logs").mkdir(exist_ok=True)
        self._record(services=[], ports=asdict(ports), flink_home=str(artifacts.flink_home),
                     job_server_jar=str(artifacts.job_server_jar or ""),
                     expansion_service_jar=str(artifacts.expansion_service_jar or ""), missing=artifacts.missing,
                     beam_version=self.config.beam_version, flink_version=self.config.flink_version,
                     kafka_version=self.config.kafka_version, project=str(ROOT), started=time.time(),
                     worker_env=artifacts.worker_env.describe() if artifacts.worker_env else None)
        try:
            deadline = time.monotonic() + timeout_s
            self._start_flink(artifacts.flink_home, artifacts.worker_env)
            self._start_pool()
            self._start_kafka(artifacts.kafka_libs)
            self._wait("Flink (JobManager and TaskManagers)", self._flink_ready, deadline)
            self._wait("the Beam worker pool", lambda: _port_open(ports.pool), deadline)
            self._wait("the Kafka broker", self._kafka_ready, deadline)
        except BaseException:
            self.down()
            raise
        _say(f"up: Flink at http://localhost:{ports.rest} ({self.config.taskmanagers} TaskManagers x "
             f"{self.config.slots} slots), worker pool at localhost:{ports.pool}, Kafka at localhost:{ports.kafka}")
        for name, why in artifacts.missing.items():
            _say(f"not available: {why}")
        return self._state()

    def _spawn(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> Service:
        log = self.config.run / "logs" / f"{name}.out"
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self.config.run, env={**os.environ, **(env or {})}, start_new_session=True)
        stat = _stat(proc.pid)
        service = Service(name, proc.pid, stat[2] if stat else 0, str(log))
        self._add(service)
        return service

    def _flink_conf(self, home: Path, env: WorkerEnv | None) -> Path:
        """The run folder's ``flink-conf/``: Flink's log settings and a ``config.yaml`` of
        :meth:`_flink_settings` (the daemons' and the CLI's ``FLINK_CONF_DIR``)."""
        import yaml

        conf = self.config.run / "flink-conf"
        conf.mkdir(exist_ok=True)
        for path in (home / "conf").glob("log*"):  # log4j and logback settings of the daemons and the CLI
            shutil.copy(path, conf / path.name)
        defaults = yaml.safe_load((home / "conf" / "config.yaml").read_text())
        java_opts = defaults.get("env", {}).get("java", {}).get("opts", {}).get("all", "")
        (conf / "config.yaml").write_text(yaml.safe_dump(self._flink_settings(java_opts, env), sort_keys=False))
        return conf

    def _flink_settings(self, java_opts: str, env: WorkerEnv | None) -> dict:
        """The cluster's settings, under the key names of Flink 2.x (which 1.20 reads too);
        ../shared/ENGINES.md, "Configuration that mattered", says why each PyFlink one is there."""
        run, ports = self.config.run, self.config.ports
        for folder in ("tmp", "blobs"):
            (run / folder).mkdir(exist_ok=True)
        settings = {
            "env.java.opts.all": java_opts,
            "env.pid.dir": str(run),
            "env.log.dir": str(run / "logs"),
            "jobmanager.rpc.address": "localhost",
            "jobmanager.rpc.port": ports.rpc,
            "jobmanager.bind-host": "localhost",
            "jobmanager.memory.process.size": "1024m",
            "jobmanager.execution.failover-strategy": "region",
            "taskmanager.host": "localhost",
            "taskmanager.bind-host": "localhost",
            "taskmanager.numberOfTaskSlots": self.config.slots,
            "taskmanager.memory.process.size": "2048m",
            "taskmanager.memory.managed.size": "512m",  # PyFlink's Python workers are accounted here
            "parallelism.default": self.config.slots,
            "taskmanager.load-balance.mode": "SLOTS",  # a job's subtasks on every TaskManager, not one first
            "rest.address": "localhost",
            "rest.bind-address": "localhost",
            "rest.port": ports.rest,
            "classloader.check-leaked-classloader": False,  # Beam's job jars (apache/beam#20783)
            "classloader.resolve-order": "parent-first",  # flink-python and the connector from lib/, once
            "io.tmp.dirs": str(run / "tmp"),  # else scratch lands in /tmp
            "blob.storage.directory": str(run / "blobs"),  # else a blob of about 33 MB per job lands in /tmp
            "heartbeat.timeout": 15000,  # a killed TaskManager is given up on in 15 s, not 50
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 3,
            "restart-strategy.fixed-delay.delay": "2 s",
            "execution.checkpointing.dir": (run / "checkpoints").as_uri(),
            "execution.checkpointing.savepoint-dir": (run / "savepoints").as_uri(),
            "python.fn-execution.bundle.time": 100,  # ms; 1.20's default held results until a checkpoint
        }
        if env is not None:
            settings["python.executable"] = settings["python.client.executable"] = str(env.python)
        return settings

    def _start_flink(self, home: Path, worker: WorkerEnv | None) -> None:
        env = {"FLINK_CONF_DIR": str(self._flink_conf(home, worker)), "FLINK_LOG_DIR": str(self.config.run / "logs")}
        _say("starting the Flink JobManager and TaskManagers ...")
        # start-foreground execs the JVM: the process id recorded is the JVM's.
        self._spawn("jobmanager", [str(home / "bin" / "jobmanager.sh"), "start-foreground"], env)
        for i in range(self.config.taskmanagers):
            self._spawn(f"taskmanager-{i + 1}", [str(home / "bin" / "taskmanager.sh"), "start-foreground"], env)

    def _start_pool(self) -> None:
        # The pool starts each SDK harness as `python` from PATH with its own environment.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        _say("starting the Beam Python worker pool ...")
        self._spawn("worker-pool", [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                                    f"--service_port={self.config.ports.pool}"],
                    {"PATH": path, "PYTHONPATH": pythonpath})

    def _kafka_java(self, libs: Path, main: str, *args: str, heap: str = "256m") -> list[str]:
        return ["java", f"-Xmx{heap}", f"-Dlog4j2.configurationFile={self.config.run / 'kafka' / 'log4j2.properties'}",
                "-cp", f"{libs}/*", main, *args]

    def _start_kafka(self, libs: Path) -> None:
        ports, folder = self.config.ports, self.config.run / "kafka"
        folder.mkdir(exist_ok=True)
        data = folder / "data"
        (folder / "server.properties").write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.bootstrap.servers=localhost:{ports.controller}",
            f"listeners=PLAINTEXT://localhost:{ports.kafka},CONTROLLER://localhost:{ports.controller}",
            f"advertised.listeners=PLAINTEXT://localhost:{ports.kafka}",
            "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data}", "num.partitions=1", "auto.create.topics.enable=true",
            "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1", "group.initial.rebalance.delay.ms=0", ""]))
        (folder / "log4j2.properties").write_text("\n".join([
            "status = warn", "appender.file.type = File", "appender.file.name = file",
            f"appender.file.fileName = {self.config.run / 'logs' / 'kafka.log'}",
            "appender.file.layout.type = PatternLayout", "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = INFO", "rootLogger.appenderRef.file.ref = file", ""]))
        if not (data / "meta.properties").exists():  # a new broker: format its storage (KRaft, one voter)
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            done = _run(self._kafka_java(libs, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id,
                                         "-c", str(folder / "server.properties")), what="kafka storage format",
                        quiet=True)
            if done.returncode != 0:
                raise ClusterError(f"formatting Kafka's storage failed: {(done.stdout + done.stderr)[-2000:]}")
        _say("starting the Kafka broker (KRaft) ...")
        self._spawn("kafka", self._kafka_java(libs, "kafka.Kafka", str(folder / "server.properties"), heap="512m"))

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        started = time.monotonic()
        while True:
            dead = [s for s in self.services() if not _alive(s)]
            if dead:
                s = dead[0]
                tail = Path(s.log).read_text(errors="replace")[-3000:] if Path(s.log).exists() else ""
                raise ClusterError(f"{s.name} (pid {s.pid}) exited while waiting for {what}; its log "
                                   f"{s.log} ends:\n{tail}")
            if ready():
                _say(f"{what}: ready ({time.monotonic() - started:.0f} s)")
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} not ready in time; logs in {self.config.run / 'logs'}")
            time.sleep(0.5)

    def flink_overview(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://localhost:{self.config.ports.rest}/overview", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def _flink_ready(self) -> bool:
        overview = self.flink_overview()
        return overview is not None and overview.get("taskmanagers") == self.config.taskmanagers and \
            overview.get("slots-total") == self.config.taskmanagers * self.config.slots

    def _kafka_ready(self) -> bool:
        log = self.config.run / "logs" / "kafka.log"
        return _port_open(self.config.ports.kafka) and log.exists() and "Kafka Server started" in log.read_text(
            errors="replace")

    # --- down ---

    def down(self, *, grace_s: float = 20.0) -> list[str]:
        """Stop every process this run folder's state names (and what they started, by process
        group): TERM, then KILL after ``grace_s``. The names of those stopped."""
        services = [s for s in self.services() if _alive(s)]
        groups = {s.pid for s in services if (_stat(s.pid) or ("", 0, 0))[1] == s.pid}
        for s in reversed(services):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.pid, signal.SIGTERM) if s.pid in groups else os.kill(s.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            for s in services:
                _reap(s.pid)
            if not any(_alive(s) for s in services) and not _group_members(groups):
                break
            time.sleep(0.2)
        else:
            for pid in [s.pid for s in services if _alive(s)] + _group_members(groups):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            for s in services:
                _reap(s.pid)
        for s in services:  # what exited after the loop's last look: no zombie of ours stays
            _reap(s.pid)
        left = [s.name for s in services if _alive(s)] + [str(p) for p in _group_members(groups)]
        if left:
            raise ClusterError(f"still running after KILL: {left}")
        if self.state_path.exists():
            self._record(services=[], stopped=time.time())
        return [s.name for s in services]

    # --- status ---

    def status(self) -> dict:
        state = self._state()
        overview = self.flink_overview()
        return {"run": str(self.config.run),
                "services": {s.name: {"pid": s.pid, "alive": _alive(s), "log": s.log} for s in self.services()},
                "flink": overview and {k: overview.get(k) for k in ("taskmanagers", "slots-total", "jobs-running",
                                                                     "flink-version")},
                "kafka": f"localhost:{self.config.ports.kafka}" if _port_open(self.config.ports.kafka) else None,
                "missing": state.get("missing", {}),
                "worker_env": _worker_env_status(state.get("worker_env")),
                "beam_options": beam_options(state) if state else []}


def _worker_env_status(env: dict | None) -> dict | None:
    """The PyFlink workers' environment a state names: its folder, Python, pinned versions."""
    if not env:
        return None
    return {"path": env["path"], "python": env["python"], "python_version": env["python_version"],
            "exists": Path(env["python"]).exists(), "versions": env["versions"]}


def beam_options(state: dict) -> list[str]:
    """The Beam options that run a Python pipeline on the cluster a state describes."""
    ports = state["ports"]
    options = ["--runner=FlinkRunner", f"--flink_master=localhost:{ports['rest']}",
               f"--flink_version={'.'.join(state['flink_version'].split('.')[:2])}",
               "--environment_type=EXTERNAL", f"--environment_config=localhost:{ports['pool']}"]
    if state.get("job_server_jar"):
        options.append(f"--flink_job_server_jar={state['job_server_jar']}")
    options += [f"--job_server_jvm_properties={p}" for p in JOB_SERVER_JVM]
    return options


@contextlib.contextmanager
def running(config: Config, *, timeout_s: float = 180.0) -> Iterator[LocalCluster]:
    """The cluster, up for the ``with`` block and always stopped after it."""
    cluster = LocalCluster(config)
    try:
        cluster.up(timeout_s=timeout_s)
        yield cluster
    finally:
        cluster.down()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m renyi_stream.pipelines.engines.local_cluster", allow_abbrev=False,
                                     description="A local Flink cluster (JobManager + TaskManagers), a Beam "
                                                 "Python worker pool and a Kafka broker (KRaft).")
    parser.add_argument("command", choices=["up", "down", "status", "fetch"])
    parser.add_argument("--cache", help=f"the cache folder (default ${CACHE_VARIABLE} or ~/.cache/renyi-stream/engines)")
    parser.add_argument("--run", help=f"the run folder: logs, state, checkpoints (default ${RUN_VARIABLE} or <cache>/run)")
    defaults = Ports()
    for name in asdict(defaults):
        parser.add_argument(f"--{name}-port", type=int, default=getattr(defaults, name), dest=f"{name}_port")
    parser.add_argument("--flink-version", default=FLINK_VERSION, choices=sorted(FLINK_RELEASES),
                        help=f"the Flink release to assemble and start (default {FLINK_VERSION}; the workers' "
                             "environment pins apache-flink to it, which 1.20.5 cannot resolve: see --no-worker-env)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter the PyFlink workers' environment is made with (default: this one)")
    parser.add_argument("--no-worker-env", dest="worker_env", action="store_false",
                        help="build no PyFlink workers' environment (Java jobs and the Beam worker pool only)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness (up)")
    parser.add_argument("--retry-missing", action="store_true",
                        help="ask Maven Central again for jars it did not serve within the last day (fetch)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ports = Ports(**{name: getattr(args, f"{name}_port") for name in asdict(Ports())})
    config = Config.default(cache=args.cache, run=args.run, ports=ports, flink_version=args.flink_version,
                            python=args.python, worker_env=args.worker_env)
    cluster = LocalCluster(config)
    try:
        if args.command == "fetch":
            print(json.dumps(asdict(fetch(config, retry_missing=args.retry_missing)), indent=2, default=str))
        elif args.command == "up":
            cluster.up(timeout_s=args.timeout)
            print(" ".join(beam_options(cluster._state())))
        elif args.command == "down":
            stopped = cluster.down()
            _say(f"stopped {', '.join(stopped) if stopped else 'nothing (nothing was running)'}")
        else:
            print(json.dumps(cluster.status(), indent=2))
    except ClusterError as exc:
        print(f"[cluster] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
