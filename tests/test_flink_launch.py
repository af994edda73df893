"""``renyi-stream stream --runner flink`` (pipelines/streaming/flink/launch.py, issue 38 item 1): which
command lines ask for the Flink job, what reaches the job, and the refusals a user meets before
anything is submitted. Submitting to a real cluster: tests/engines/test_flink_stream.py."""

from __future__ import annotations

import json
import socket

import pytest

from renyi_stream.pipelines.cli.main import main as cli_main
from renyi_stream.pipelines.engines.local_cluster import RUN_VARIABLE, STATE_FILE
from renyi_stream.pipelines.streaming.flink.launch import FlinkTarget, _without, flink_run_command, uses_flink


@pytest.mark.parametrize("argv", [["--runner", "flink"], ["--replay", "a.arrow", "--runner=flink"]])
def test_runner_flink_asks_for_the_flink_job(argv):
    assert uses_flink(argv)


@pytest.mark.parametrize("argv", [[], ["--runner", "FlinkRunner"], ["--runner=DirectRunner"], ["--runner"],
                                  ["--replay", "flink"]])
def test_other_runners_and_a_file_named_flink_stay_with_the_beam_job(argv):
    assert not uses_flink(argv)


def test_the_launchers_own_options_do_not_reach_the_job():
    argv = ["--runner", "flink", "--replay", "a.arrow", "--flink-home=/f", "--flink-conf-dir", "/c", "--parallelism",
            "2"]
    assert _without(argv, ("--runner", "--flink-home", "--flink-conf-dir")) == ["--replay", "a.arrow",
                                                                               "--parallelism", "2"]


def test_the_job_s_options_follow_flink_runs_own_after_a_double_dash(tmp_path):
    target = FlinkTarget(tmp_path / "flink", tmp_path / "conf", tmp_path / "log")
    command, env = flink_run_command(["--replay", "a.arrow"], target, parallelism=4)
    assert command == [str(tmp_path / "flink" / "bin" / "flink"), "run", "-p", "4", "-pym",
                       "renyi_stream.pipelines.streaming.flink", "--", "--replay", "a.arrow"]
    assert env["FLINK_CONF_DIR"] == str(tmp_path / "conf") and "VIRTUAL_ENV" not in env


def test_a_flink_home_without_its_configuration_is_refused(capsys):
    assert cli_main(["stream", "--runner", "flink", "--flink-home", "/opt/flink", "--replay", "a.arrow"]) == 2
    assert "--flink-home and --flink-conf-dir name another cluster together" in capsys.readouterr().err


def test_a_flink_home_without_bin_flink_is_refused(tmp_path, capsys):
    assert cli_main(["stream", "--runner", "flink", "--flink-home", str(tmp_path), "--flink-conf-dir", str(tmp_path),
                     "--replay", "a.arrow"]) == 2
    assert f"argument --flink-home: {tmp_path} has no bin/flink" in capsys.readouterr().err


def test_a_local_cluster_that_is_not_running_is_refused_naming_the_command_that_starts_it(tmp_path, monkeypatch,
                                                                                          capsys):
    with socket.socket() as s:  # a port nothing listens on: the run folder's recorded REST port
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    (tmp_path / STATE_FILE).write_text(json.dumps({"ports": {"rest": free}}))
    monkeypatch.setenv(RUN_VARIABLE, str(tmp_path))
    assert cli_main(["stream", "--runner", "flink", "--replay", "a.arrow"]) == 2
    err = capsys.readouterr().err
    assert "the local Flink cluster is not running" in err
    assert "python -m renyi_stream.pipelines.engines.local_cluster up" in err


def test_help_lists_the_stream_jobs_options_and_the_flink_runners(capsys):
    assert cli_main(["stream", "--runner", "flink", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--replay" in out and "--flink-conf-dir" in out


# --- the Flink job's own refusals, before anything is planned or submitted (no PyFlink needed) ------

_PROMISE = ["--columns", "a", "--start", "2026-03-01", "--end", "2026-03-02", "--epsilon", "1", "--delta", "1e-6",
            "--norm-budget", "30", "--noise-key", "k.key", "--releases-parquet", "pub", "--output", "cur"]


@pytest.mark.parametrize("source, said", [
    (["--subscription", "projects/p/subscriptions/s"], "argument --subscription: the Flink job reads Kafka"),
    (["--kafka-topic", "t", "--bootstrap-servers", "h:1", "--kafka-expansion-service", "h:2"],
     "argument --kafka-expansion-service"),
    (["--replay", "a.arrow", "--kafka-bounded"], "argument --kafka-bounded: only goes with --kafka-topic"),
    (["--replay", "a.arrow", "--dry-run"], "argument --dry-run"),
])
def test_the_flink_job_refuses_what_it_cannot_run_naming_the_option(source, said, capsys, tmp_path, monkeypatch):
    from renyi_stream.pipelines.streaming.flink.job import main as flink_job

    monkeypatch.chdir(tmp_path)
    assert flink_job([*source, *_PROMISE]) == 2
    assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_flink_job_refuses_an_option_neither_it_nor_the_stream_job_knows(capsys, tmp_path, monkeypatch):
    from renyi_stream.pipelines.streaming.flink.job import main as flink_job

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        flink_job(["--replay", "a.arrow", *_PROMISE, "--paralelism", "4"])
    assert exit_.value.code == 2 and "--paralelism" in capsys.readouterr().err
