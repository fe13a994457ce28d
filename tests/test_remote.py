"""s3:// inputs through fsspec against an S3 server this test starts on 127.0.0.1 (moto's
server mode): the report of the local directory, with and without a dask cluster whose
workers read the objects themselves; a missing bucket and a missing extra are one line.

frtrace runs in subprocesses with the endpoint and dummy credentials in the environment,
the usual way for S3 (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."""

from __future__ import annotations

import json
import socket
import sys

import pytest
from helpers import nccl_hang_dumps, run_cli, stderr_lines, write_job
from test_cluster import frtrace_process, in_cluster

BUCKET = "fr-dumps"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    pytest.importorskip("s3fs", reason="frtrace[s3] is not installed")
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    boto3 = pytest.importorskip("boto3", reason="moto[server] is not installed")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET)
        local = write_job(tmp_path_factory.mktemp("s3") / "job", nccl_hang_dumps(world=4, culprit=2))
        for path in sorted(local.iterdir()):
            client.put_object(Bucket=BUCKET, Key=f"job123/{path.name}", Body=path.read_bytes())
        client.put_object(Bucket=BUCKET, Key="job123/train.log", Body=b"not a dump\n")
        yield env, local
    finally:
        server.stop()


def test_s3_prefix_gives_the_report_of_the_directory(s3):
    env, local = s3
    expected = run_cli([local, "--format", "json"])
    done = frtrace_process([f"s3://{BUCKET}/job123/", "--format", "json"], **env)
    assert done.returncode == expected.exit_code, done.stderr
    report = json.loads(done.stdout)
    assert report["inputs"].pop("skipped_files") == [{"path": f"s3://{BUCKET}/job123/train.log",
                                                      "reason": "no rank number in the file name"}]
    assert report["inputs"].pop("dump_files") == [{"rank": r, "path": f"s3://{BUCKET}/job123/rank_{r}"} for r in range(4)]
    assert report == _without_skipped(expected.stdout)
    assert report["suspect_ranks"] == [2]


def test_s3_workers_read_the_objects_themselves(s3):
    env, local = s3
    expected = run_cli([local, "--format", "json"])
    (result,) = in_cluster([[f"s3://{BUCKET}/job123", "--format", "json", "--scheduler", "{scheduler}"]], **env)
    assert result["code"] == expected.exit_code, result["stderr"]
    assert _without_skipped(result["stdout"]) == _without_skipped(expected.stdout)


def _without_skipped(report: str) -> dict:
    """The report without what names files (which differ between a store and a directory)."""
    loaded = json.loads(report)
    loaded["inputs"].pop("skipped_files")
    loaded["inputs"].pop("dump_files", None)
    return loaded


def test_missing_bucket_is_one_line_exit_2(s3):
    env, _ = s3
    done = frtrace_process(["s3://no-such-bucket/job/"], **env)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "s3://no-such-bucket/job/" in done.stderr


def test_without_fsspec_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    result = run_cli(["s3://bucket/job/"])
    assert result.exit_code == 2
    assert stderr_lines(result) == ["frtrace: error: reading URLs needs fsspec: install the s3 or gcs extra: pip install '.[s3]' "
                                   "or '.[gcs]' in a checkout of frtrace (frtrace[s3] / frtrace[gcs] once it is released on PyPI)"]


def _put(env: dict, objects: dict) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    for key, body in objects.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)


def test_keys_with_dot_dot_are_reported_not_dropped(s3):
    # Issue 26 item 9: `job/../rank_7` disappeared without a word (it looked hidden).
    env, local = s3
    _put(env, {**{f"job456/{p.name}": p.read_bytes() for p in local.iterdir()},
               "job456/../rank_7": (local / "rank_0").read_bytes(), "job456/./rank_8": b"x", "job456/.hidden": b"x"})
    done = frtrace_process([f"s3://{BUCKET}/job456/", "--format", "json"], **env)
    report = json.loads(done.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1, 2, 3] and report["suspect_ranks"] == [2]
    lines = done.stderr.splitlines()
    for key in ("job456/../rank_7", "job456/./rank_8"):
        (line,) = [line for line in lines if f"s3://{BUCKET}/{key}:" in line]
        assert "object key names '.' or '..': not read" in line
    assert ".hidden" not in done.stderr
    assert [e["path"] for e in report["inputs"]["unreadable_files"]] == [f"s3://{BUCKET}/job456/../rank_7",
                                                                          f"s3://{BUCKET}/job456/./rank_8"]


def test_a_key_reached_twice_through_double_slashes_is_read_once(s3):
    # Issue 26 item 6: a prefix written with `//` next to the plain one aborted the run (exit 2).
    env, local = s3
    _put(env, {**{f"job789/{p.name}": p.read_bytes() for p in local.iterdir()},
               "job789//rank_1": b"\x80\x02 broken, and listed first"})
    done = frtrace_process([f"s3://{BUCKET}/job789/", "--format", "json"], **env)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1, 2, 3] and report["suspect_ranks"] == [2]
    (note,) = done.stderr.splitlines()
    assert note == (f"frtrace: s3://{BUCKET}/job789/: 1 object key listed more than once (fr-dumps/job789/rank_1): "
                    "the last of each is read")
