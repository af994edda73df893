"""The workers' environment without building one (pipelines/engines/worker_env.py): what it
refuses and how it says so, when it is rebuilt, which stale ones it removes. No Java and no
network (a virtual environment made offline, with a distribution whose requirement is missing)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from renyi_stream.pipelines.engines import worker_env
from renyi_stream.pipelines.engines.errors import ClusterError
from renyi_stream.pipelines.engines.local_cluster import Config

#: The paragraph pip 23 to 25 print when a resolution is impossible, as it printed it for Flink 1.20.5.
PIP_CONFLICT = """ERROR: Cannot install apache-flink==1.20.5 and renyi-stream[flink]==0.1.0 because these package \
versions have conflicting dependencies.

The conflict is caused by:
    apache-flink 1.20.5 depends on apache-beam<2.49.0 and >=2.43.0
    renyi-stream[flink] 0.1.0 depends on apache-beam<3 and >=2.61

To fix this you could try to:
"""


def test_pip_check_failing_is_a_cluster_error_naming_what_conflicts(tmp_path):
    folder = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)  # offline: pip comes from ensurepip
    site = Path(subprocess.run([str(folder / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    info = site / "broken_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-dist\nVersion: 1.0\n"
                                   "Requires-Dist: not-installed-anywhere>=1\n")
    (info / "RECORD").write_text("")
    with pytest.raises(ClusterError, match="pip check failed .*broken-dist 1.0 requires not-installed-anywhere"):
        worker_env.check(folder)


def test_pips_conflict_paragraph_is_what_the_error_names():
    assert worker_env.conflict(PIP_CONFLICT) == ("apache-flink 1.20.5 depends on apache-beam<2.49.0 and >=2.43.0; "
                                                 "renyi-stream[flink] 0.1.0 depends on apache-beam<3 and >=2.61")
    assert worker_env.conflict("ERROR: No matching distribution found for x==9\n") == \
        "ERROR: No matching distribution found for x==9"


def test_an_interpreter_that_does_not_run_is_named(tmp_path):
    with pytest.raises(ClusterError, match="python='/nowhere/python3' does not run"):
        worker_env.ensure(tmp_path, flink_version="2.2.0", python="/nowhere/python3", project=tmp_path)


def test_a_flink_version_without_a_known_release_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"flink_version must be one of 1.20.5, 2.2.0, got flink_version='1.19.1'"):
        Config.default(cache=tmp_path, flink_version="1.19.1")
    with pytest.raises(ValueError, match="flink_version must be a version"):
        worker_env.ensure(tmp_path, flink_version="", python=sys.executable, project=tmp_path)


def test_the_settings_name_the_environment_and_use_flink_2_key_names(tmp_path):
    from renyi_stream.pipelines.engines.local_cluster import LocalCluster

    config = Config.default(cache=tmp_path / "cache", run=tmp_path / "run")
    config.run.mkdir(parents=True)
    env = worker_env.WorkerEnv(tmp_path / "env", tmp_path / "env" / "bin" / "python", "3.11", (), {}, 0.0)
    settings = LocalCluster(config)._flink_settings("", env)
    assert settings["python.executable"] == settings["python.client.executable"] == str(env.python)
    assert settings["classloader.resolve-order"] == "parent-first"
    assert settings["execution.checkpointing.dir"] == (config.run / "checkpoints").as_uri()
    assert not {"state.checkpoints.dir", "cluster.evenly-spread-out-slots"} & set(settings)
    assert "python.executable" not in LocalCluster(config)._flink_settings("", None)


def test_the_metadata_digest_ignores_comments_and_follows_the_dependencies(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "p"\ndependencies = ["a>=1"]\n')
    first = worker_env._metadata_digest(tmp_path)
    pyproject.write_text('# a comment\n[project]\nname = "p"\ndependencies = ["a>=1"]  # why\n')
    assert worker_env._metadata_digest(tmp_path) == first
    pyproject.write_text('[project]\nname = "p"\ndependencies = ["a>=2"]\n')
    assert worker_env._metadata_digest(tmp_path) != first


def test_a_new_build_removes_the_stale_environments_of_its_versions_but_one_a_process_uses(tmp_path):
    names = ["flink-2.2.0-py3.11-new", "flink-2.2.0-py3.11-old", "flink-2.2.0-py3.11-used", "flink-2.2.0-py3.12-other",
             "flink-1.20.5-py3.11-other"]
    for name in names:
        (tmp_path / name / "bin").mkdir(parents=True)
    user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / names[2])])
    try:
        deadline = time.monotonic() + 10
        while not worker_env._in_use(tmp_path / names[2]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker_env._prune(tmp_path / names[0]) == [tmp_path / names[1]]
    finally:
        user.kill()
        user.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - {names[1]})
