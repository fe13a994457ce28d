"""--scheduler: reading the dumps on a real dask.distributed cluster gives the report the
local process pool gives, byte for byte; a lost worker or an unreachable scheduler is one
line, and what was read is analysed; without the extra, one line naming it.

The clusters run in a subprocess each (a LocalCluster of 2 workers, in threads unless
said otherwise): dask leaves threads behind, and this test process must stay single-threaded
for the loader's address-space cap (see loader._decoding_is_capped).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from helpers import (
    deep_tuple_key_dump,
    dump,
    entry,
    healthy_dumps,
    nccl_hang_dumps,
    run_cli,
    stderr_lines,
    write_job,
    write_synth_job,
)

import frtrace
from frtrace.testing.joblogs import job_logs, write_job_logs
from frtrace.testing.synth import Fault, generate

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SECONDS = 180  # every subprocess here ends by then, whatever happens

# Runs the CLI (CliRunner) once per argument list against a LocalCluster of 2 workers,
# `{scheduler}` in an argument being its address; prints [{code, stdout, stderr}] as JSON.
IN_CLUSTER = textwrap.dedent("""
    import json, logging, os, sys
    from click.testing import CliRunner
    from distributed import LocalCluster
    from frtrace.cli.analyse import frtrace
    processes = os.environ.get("TEST_PROCESSES") == "1"
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None,
                           silence_logs=logging.CRITICAL)
    if os.environ.get("TEST_DOOMED"):
        import cluster_tasks
        from frtrace.load import cluster as frcluster
        connect = frcluster.DaskRunner.connect
        def doomed(address):
            runner = connect(address)
            runner.task = cluster_tasks.die_on_doomed_rank
            return runner
        frcluster.DaskRunner.connect = doomed
    # Dumps this process received from the workers (in a cluster of processes, a dump taken
    # up on a worker is not counted here).
    from frtrace.load import cluster as frcluster, loader
    received = []
    def counted(batch, *args, take=loader.take_batch):
        import pickle
        received.extend(pickle.loads(batch) if isinstance(batch, bytes) else batch)  # a cluster task's batch travels pickled
        return take(batch, *args)
    loader.take_batch = frcluster.take_batch = counted
    if os.environ.get("TEST_PIECE"):  # files made on a worker come back in pieces of this many bytes
        frcluster.FILE_PIECE = int(os.environ["TEST_PIECE"])
    if os.environ.get("TEST_CHDIR"):  # the workers started elsewhere: they do not share this working directory
        os.chdir(os.environ["TEST_CHDIR"])
    out = []
    for args in json.loads(sys.argv[1]):
        args = [a.replace("{scheduler}", cluster.scheduler_address) for a in args]
        received.clear()
        result = CliRunner().invoke(frtrace, args)
        out.append({"code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                    "received": len(received)})
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # no teardown of the cluster: this process is done
""")


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def in_cluster(arg_lists: list, **env) -> list:
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    done = subprocess.run([sys.executable, "-c", IN_CLUSTER, json.dumps([[str(a) for a in args] for args in arg_lists])],
                          capture_output=True, text=True, timeout=SECONDS, env=_env(**env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def frtrace_process(args: list, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frtrace", *map(str, args)], capture_output=True, text=True,
                          timeout=SECONDS, env=_env(**env))


@pytest.fixture(scope="module")
def synth_job(tmp_path_factory) -> Path:
    job = generate(64, tp=4, pp=2, steps=4, fault=Fault("hang", rank=5, group="tp", step=2), timing=True)
    return write_synth_job(tmp_path_factory.mktemp("synth") / "job", job)


def test_report_is_byte_identical_on_a_2_worker_cluster(synth_job):
    local_json = run_cli([synth_job, "--format", "json", "--workers", "2"])
    local_text = run_cli([synth_job, "--workers", "2"])
    remote_json, remote_text = in_cluster([[synth_job, "--format", "json", "--scheduler", "{scheduler}"],
                                           [synth_job, "--scheduler", "{scheduler}"]])
    assert json.loads(local_json.stdout)["suspect_ranks"] == [5]
    assert (remote_json["code"], remote_json["stdout"]) == (local_json.exit_code, local_json.stdout)
    assert (remote_text["code"], remote_text["stdout"]) == (local_text.exit_code, local_text.stdout)
    assert remote_json["stderr"] == local_json.stderr == ""


def test_local_cluster_of_worker_processes_through_the_cli(synth_job):
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    local = run_cli([synth_job, "--format", "json", "--workers", "2"])
    done = frtrace_process([synth_job, "--format", "json", "--scheduler", "local:2"])
    assert (done.returncode, done.stdout) == (local.exit_code, local.stdout)
    assert done.stderr == ""


def test_no_entry_comes_back_to_the_client_only_the_report_and_the_files(synth_job, tmp_path):
    local = run_cli([synth_job, "--format", "json", "--workers", "2"])
    local_ranks = run_cli([synth_job, "--ranks", "--workers", "2"])
    files = ("db.sqlite", "db.pkl", "trace.json", "report.html")
    local_files = tmp_path / "local"
    local_files.mkdir()
    local_written = run_cli([synth_job, "--format", "json", "--workers", "2", "--selected-ranks", "4-7",
                             "-o", local_files / "db.sqlite", "--timeline", local_files / "trace.json",
                             "--html", local_files / "report.html"])
    run_cli([synth_job, "--workers", "2", "-o", local_files / "db.pkl"])
    report_only, ranks_only, written, pickled = in_cluster(
        [[synth_job, "--format", "json", "--scheduler", "{scheduler}"],
         [synth_job, "--ranks", "--scheduler", "{scheduler}"],
         [synth_job, "--format", "json", "--scheduler", "{scheduler}", "--selected-ranks", "4-7",
          "-o", tmp_path / "db.sqlite", "--timeline", tmp_path / "trace.json", "--html", tmp_path / "report.html"],
         [synth_job, "--scheduler", "{scheduler}", "-o", tmp_path / "db.pkl"]],
        TEST_PROCESSES="1", TEST_PIECE="100000")
    # The report and the files are made on a worker: not one dump travels to the process that asked.
    assert [run["received"] for run in (report_only, ranks_only, written, pickled)] == [0, 0, 0, 0]
    assert (report_only["code"], report_only["stdout"]) == (local.exit_code, local.stdout)
    assert (ranks_only["code"], ranks_only["stdout"]) == (local_ranks.exit_code, local_ranks.stdout)
    assert (written["code"], written["stdout"]) == (local_written.exit_code, local_written.stdout) == (1, local.stdout)
    # The same notes, naming the same paths but for the folder, and the same bytes written.
    assert written["stderr"].replace(str(tmp_path), "DIR") == local_written.stderr.replace(str(local_files), "DIR")
    assert "wrote DIR/trace.json" in written["stderr"].replace(str(tmp_path), "DIR")
    for name in files:
        assert (tmp_path / name).read_bytes() == (local_files / name).read_bytes(), name


def test_a_pickle_that_crashes_its_decoder_costs_only_its_file_on_a_cluster(tmp_path):
    """Workers decode in children they keep (load/cluster_worker.py). A pickle nested a
    million deep, which crashes the C unpickler, is decoded in a child of the decoder's
    own: it costs its file only, the kept child goes on, and the report is the local run's.
    (A kept child that dies itself: tests/test_forked_server.py.)"""
    directory = write_job(tmp_path / "job", healthy_dumps(40))
    (directory / "rank_7").write_bytes(deep_tuple_key_dump(1_000_000))
    local = run_cli([directory, "--format", "json", "--workers", "2"])
    (remote,) = in_cluster([[directory, "--format", "json", "--scheduler", "{scheduler}"]], TEST_PROCESSES="1")
    assert local.exit_code == remote["code"] == 3
    assert remote["stdout"] == local.stdout
    assert json.loads(remote["stdout"])["inputs"]["ranks_missing"] == [7]
    assert remote["stderr"] == local.stderr and "nested too deeply" in remote["stderr"]


def test_workers_elsewhere_read_a_job_given_by_a_relative_path(synth_job, tmp_path, monkeypatch):
    """The workers of a real cluster run in directories of their own: `frtrace job/` must
    still reach them, and the report name the files as given, as the local run does."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "job").symlink_to(synth_job)
    with tarfile.open(here / "job.tar", "w") as archive:  # members are read in place from a relative archive too
        archive.add(synth_job, arcname="job")
    monkeypatch.chdir(here)
    local = [run_cli([given, "--format", "json", "--workers", "2", "-v"]) for given in ("job", "job.tar")]
    monkeypatch.chdir(tmp_path)  # where the cluster's workers start; the command then runs in `here`
    remote = in_cluster([[given, "--format", "json", "--scheduler", "{scheduler}", "-v"] for given in ("job", "job.tar")],
                        TEST_PROCESSES="1", TEST_CHDIR=str(here))
    for here_run, there_run in zip(local, remote):
        assert (there_run["code"], there_run["stdout"]) == (here_run.exit_code, here_run.stdout)
        assert _without_timing(there_run["stderr"]) == _without_timing(here_run.stderr)
    assert '"job.tar:job/' in remote[1]["stdout"]  # the members named as given, not by an absolute path


def _without_timing(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if " total (" not in line)


def test_dumps_with_logs_on_a_cluster_report_as_a_local_run(tmp_path, monkeypatch):
    """With --logs the logs are read where the analysis is too: no dump comes back to the
    client; the workers, started elsewhere, find logs given by a relative path; and the
    report and the notes name them as given, as the local run's do. Logs that cannot be
    read are the local run's one-line error, exit 2."""
    here = tmp_path / "here"
    dumps = {rank: dump([entry(s) for s in (1, 2, 3)] + [entry(4, state="started")], ranks=range(4))
             for rank in range(3)}  # rank 3 left no dump; its log says it crashed
    write_job(here / "dumps", dumps)
    write_job_logs(job_logs(world=4, era="2.6", fault="crash", culprits=(3,), seq=4), here / "logs")
    (here / "empty").mkdir()
    runs = [["dumps", "--logs", "logs", "--format", "json"], ["dumps", "--logs", "logs"], ["dumps", "--logs", "empty"]]
    monkeypatch.chdir(here)
    local = [run_cli(args + ["--workers", "2"]) for args in runs]
    monkeypatch.chdir(tmp_path)  # where the cluster's workers start; the command then runs in `here`
    remote = in_cluster([args + ["--scheduler", "{scheduler}"] for args in runs], TEST_PROCESSES="1",
                        TEST_CHDIR=str(here))
    for here_run, there_run in zip(local, remote):
        assert (there_run["code"], there_run["stdout"], there_run["stderr"]) == \
            (here_run.exit_code, here_run.stdout, here_run.stderr)
        assert there_run["received"] == 0  # the dumps stayed on the cluster
    assert [run["code"] for run in remote] == [1, 1, 2]
    assert json.loads(remote[0]["stdout"])["suspects"] == [{"rank": 3, "host": "node01"}]
    assert '"path": "logs/' in remote[0]["stdout"]
    assert remote[2]["stderr"] == "frtrace: error: no log files found in empty\n"


def test_on_cluster_runs_the_function_where_the_analysis_is(synth_job):
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    code = textwrap.dedent(f"""
        import json, logging, os, sys
        from distributed import LocalCluster
        import frtrace, cluster_tasks
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.CRITICAL)
        seen = frtrace.on_cluster({str(synth_job)!r}, cluster_tasks.status_and_worker_pid,
                                  scheduler=cluster.scheduler_address)
        print(json.dumps([*seen, os.getpid()]))
        sys.stdout.flush()
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SECONDS, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    status, suspects, worker_pid, client_pid = json.loads(done.stdout.strip().splitlines()[-1])
    local = frtrace.diagnose(frtrace.analyze(synth_job, workers=1))
    assert (status, suspects) == (local.status, list(local.suspect_ranks)) == ("faults", [5])
    assert worker_pid != client_pid


def test_a_second_local_cluster_says_nothing_about_ports(synth_job):
    """dask's default HTTP port (8787) held by another local cluster (a second frtrace run)
    must not turn into a warning on stderr."""
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    import socket

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen(1)
    except OSError:
        pass  # held already: as good for this test
    try:
        done = frtrace_process([synth_job, "--format", "json", "--scheduler", "local:1"])
    finally:
        holder.close()
    assert done.returncode == 1 and done.stderr == ""
    assert json.loads(done.stdout)["suspect_ranks"] == [5]


def test_the_worker_holding_the_analysis_dying_is_an_input_error(synth_job):
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    code = textwrap.dedent(f"""
        import logging, os, sys
        from distributed import LocalCluster
        import frtrace, cluster_tasks
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.CRITICAL)
        try:
            frtrace.on_cluster({str(synth_job)!r}, cluster_tasks.die, scheduler=cluster.scheduler_address)
        except frtrace.InputError as exc:
            print("InputError:", exc)
        sys.stdout.flush()
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SECONDS,
                          env=_env(DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == ("InputError: the analysis on the dask cluster failed: the worker "
                                                    "holding it died (out of memory? it holds every rank's entries)")


def test_a_worker_that_dies_is_one_line_and_the_rest_is_analysed(tmp_path):
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=8, culprit=6))
    (result,) = in_cluster([[directory, "--format", "json", "--scheduler", "{scheduler}"]],
                           TEST_PROCESSES="1", TEST_DOOMED="1",
                           DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0")
    errors = [line for line in result["stderr"].splitlines() if "error:" in line]
    assert len(errors) == 1 and "a dask worker died while reading them" in errors[0], result["stderr"]
    report = json.loads(result["stdout"])
    assert 3 in report["inputs"]["ranks_missing"]
    # The tasks the dying worker held besides rank 3's are lost with it: which those are
    # is up to dask's scheduling, so only how much survives is asserted.
    assert 3 not in report["inputs"]["ranks_found"] and len(report["inputs"]["ranks_found"]) >= 4


def test_unreachable_scheduler_is_one_line_exit_2(tmp_path):
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=2, culprit=1))
    done = frtrace_process([directory, "--scheduler", "tcp://127.0.0.1:9"],
                           DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="2s")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert "cannot reach the dask scheduler at tcp://127.0.0.1:9" in done.stderr


def test_without_dask_the_error_names_the_extra(tmp_path, monkeypatch):
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=2, culprit=1))
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    result = run_cli([directory, "--scheduler", "local:2"])
    assert result.exit_code == 2
    assert stderr_lines(result) == ["frtrace: error: --scheduler needs dask.distributed: install the dask extra: pip install "
                                   "'.[dask]' in a checkout of frtrace (frtrace[dask] once it is released on PyPI)"]


def test_bad_local_worker_count_is_a_usage_error(tmp_path):
    pytest.importorskip("distributed", reason="frtrace[dask] is not installed")
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=2, culprit=1))
    result = run_cli([directory, "--scheduler", "local:zero"])
    assert result.exit_code == 2 and "local:N takes a number of workers" in result.stderr


def test_the_plain_cli_path_imports_neither_dask_nor_fsspec(tmp_path):
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=2, culprit=1))
    code = ("import sys; from frtrace.cli import main; import frtrace.match.analysis, frtrace.load.loader;"
            "from click.testing import CliRunner; from frtrace.cli.analyse import frtrace as cmd;"
            f"CliRunner().invoke(cmd, [{str(directory)!r}]);"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'fsspec', 's3fs', 'gcsfs'));"
            "print(bad)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SECONDS, env=_env())
    assert done.stdout.strip() == "[]", done.stderr
