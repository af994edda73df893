"""Submitting the streaming job (:mod:`renyi_stream.pipelines.streaming.flink.job`) to a Flink cluster
with ``flink run``: ``renyi-stream stream --runner flink <the stream job's options>``.

By default the cluster is the project's local one
(:mod:`renyi_stream.pipelines.engines.local_cluster`, started with ``up``; its run folder
``$RENYI_ENGINES_RUN``, else the default, and the ports ``up`` recorded there): its Flink home's
``bin/flink`` and its configuration folder (``FLINK_CONF_DIR``: the REST address, and
``python.client.executable`` / ``python.executable``, the PyFlink workers' environment with the
project installed, which also runs the job's client). ``--flink-home`` and ``--flink-conf-dir`` name
another cluster's; its configuration must name a Python with ``renyi-stream[flink]`` installed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

MODULE = "renyi_stream.pipelines.streaming.flink"
#: ``--runner flink``: the PyFlink job (Beam's own runners keep their names: DirectRunner, DataflowRunner).
RUNNER = "flink"
#: Variables that would point the client's Python at this process's environment rather than its own.
_NOT_PASSED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
_LOCAL_UP = "python -m renyi_stream.pipelines.engines.local_cluster up"


@dataclass(frozen=True)
class FlinkTarget:
    """Where ``flink run`` submits: a Flink distribution (``bin/flink``), the configuration folder it
    reads, and where the client writes its log."""

    flink_home: Path
    conf_dir: Path
    log_dir: Path

    @classmethod
    def local(cls, config: Any = None) -> "FlinkTarget":
        """The project's local cluster of ``config`` (a
        :class:`renyi_stream.pipelines.engines.local_cluster.Config`; default its default)."""
        if config is None:
            from renyi_stream.pipelines.engines.local_cluster import Config

            config = Config.default()
        run = Path(config.run)
        return cls(Path(config.flink_home), run / "flink-conf", run / "log")


def uses_flink(argv: Sequence[str]) -> bool:
    """Whether a stream job's command line asks for this runner (``--runner flink`` or ``--runner=flink``)."""
    argv = list(argv)
    return any(a == f"--runner={RUNNER}" or (a == "--runner" and argv[i + 1:i + 2] == [RUNNER])
               for i, a in enumerate(argv))


def flink_run_command(argv: Sequence[str], target: FlinkTarget, *, parallelism: int | None = None,
                      script: str | Path | None = None) -> tuple[list[str], dict[str, str]]:
    """``(command, environment)`` that runs ``python -m renyi_stream.pipelines.streaming.flink <argv>``
    on ``target``, attached (``flink run`` returns when the job has finished, with the job's exit
    status). ``argv`` follows ``--``, so no option of the stream job is read as one of ``flink
    run``'s; ``parallelism`` is ``flink run -p``. ``script``: a Python file run instead of the module
    (``flink run -py``; a test's wrapper)."""
    command = [str(target.flink_home / "bin" / "flink"), "run"]
    if parallelism:
        command += ["-p", str(int(parallelism))]
    command += ["-py", str(script)] if script else ["-pym", MODULE]
    command += ["--", *argv]
    env = {k: v for k, v in os.environ.items() if k not in _NOT_PASSED}
    env.update({"FLINK_CONF_DIR": str(target.conf_dir), "FLINK_LOG_DIR": str(target.log_dir)})
    return command, env


def submit(argv: Sequence[str], target: FlinkTarget, *, parallelism: int | None = None, timeout_s: float | None = None,
           cwd: str | Path | None = None, script: str | Path | None = None, env: dict[str, str] | None = None,
           capture: bool = True) -> subprocess.CompletedProcess:
    """Run :func:`flink_run_command` (``env``: variables added to its environment, which the job's
    client process inherits); the completed process (stdout and stderr captured as text unless
    ``capture`` is False)."""
    command, environment = flink_run_command(argv, target, parallelism=parallelism, script=script)
    environment.update(env or {})
    return subprocess.run(command, env=environment, capture_output=capture, text=True, timeout=timeout_s, cwd=cwd)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    parser.add_argument("--runner")
    parser.add_argument("--flink-home", "--flink_home", dest="flink_home")
    parser.add_argument("--flink-conf-dir", "--flink_conf_dir", dest="flink_conf_dir")
    parser.add_argument("--parallelism", type=int)
    return parser


def _target(args: argparse.Namespace) -> tuple[FlinkTarget | None, str | None]:
    """The cluster the options name, or the local one when it is up; else ``(None, why)``."""
    if args.flink_home or args.flink_conf_dir:
        if not (args.flink_home and args.flink_conf_dir):
            return None, "--flink-home and --flink-conf-dir name another cluster together (neither: the local cluster)"
        home, conf = Path(args.flink_home), Path(args.flink_conf_dir)
        if not (home / "bin" / "flink").exists():
            return None, f"argument --flink-home: {home} has no bin/flink"
        if not conf.is_dir():
            return None, f"argument --flink-conf-dir: {conf} is not a folder"
        return FlinkTarget(home, conf, Path.cwd() / "flink-log"), None
    from renyi_stream.pipelines.engines.local_cluster import Config, LocalCluster, Ports

    cluster = LocalCluster(Config.default())
    recorded = cluster._state().get("ports")  # the ports `up` started this run folder's cluster on
    if recorded:
        cluster = LocalCluster(Config.default(ports=Ports(**recorded)))
    if not (cluster.flink_overview() or {}).get("taskmanagers"):
        return None, f"the local Flink cluster is not running: start it with `{_LOCAL_UP}` (or name another with " \
                     "--flink-home and --flink-conf-dir)"
    return FlinkTarget.local(cluster.config), None


def main(argv: Sequence[str] | None = None, *, prog: str = "renyi-stream stream") -> int:
    """``renyi-stream stream --runner flink [--flink-home DIR --flink-conf-dir DIR] <the stream job's
    options>``: submit to the cluster, attached; the job's output passes through; exit with its status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        from renyi_stream.pipelines.streaming.options import _parser as job_parser

        job_parser(prog).print_help()
        print(f"\n--runner {RUNNER}: submitted with `flink run` to the local cluster ({_LOCAL_UP}), or to "
              "--flink-home DIR --flink-conf-dir DIR; --parallelism N, --checkpointing-interval MS, --kafka-bounded "
              "(read a Kafka topic to the offsets latest at the start, then end)")
        return 0
    args, _ = _parser(prog).parse_known_args(argv)
    target, why = _target(args)
    if target is None:
        print(f"{prog}: refused: {why}", file=sys.stderr)
        return 2
    job_argv = _without(argv, ("--runner", "--flink-home", "--flink_home", "--flink-conf-dir", "--flink_conf_dir"))
    return submit(job_argv, target, parallelism=args.parallelism, capture=False).returncode


def _without(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the options ``names`` (``--name value`` or ``--name=value``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif arg.split("=", 1)[0] not in names:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
