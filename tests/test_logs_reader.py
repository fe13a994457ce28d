"""Reading logs: compressed files, cut-off and garbled lines, carriage returns and colour,
block boundaries, several runs in one file, whose line is whose, and hosts."""

import bz2
import gzip
import lzma
import tracemalloc

import pytest

from frtrace.logs import LogInputError, read_logs
from frtrace.logs.stream import StreamStats, read_marked_lines
from frtrace.testing.joblogs import job_logs, one_file, write_job_logs

TIMEOUT = ("[rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600060 "
           "milliseconds before timing out.\n")
STATUS = ("[rank{r}]:[E321 02:07:08.408500000 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {r}]  failure "
          "detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enq}, last completed work: {done}\n")


def waits(rank, seq=1580, enq=1582, done=1579):
    return TIMEOUT.format(r=rank, seq=seq) + STATUS.format(r=rank, seq=seq, enq=enq, done=done)


def positions(evidence):
    return {r: (log.groups["0"].failed_at, log.groups["0"].last_enqueued, log.groups["0"].last_completed)
            for r, log in evidence.ranks.items() if "0" in log.groups}


def test_compressed_logs_read_as_the_plain_one(tmp_path):
    text = "".join(waits(r) for r in (0, 2)).encode()
    plain = positions(read_logs([_write(tmp_path / "job.log", text)]))
    for suffix, pack in ((".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)):
        assert positions(read_logs([_write(tmp_path / f"job{suffix}", pack(text))])) == plain
    assert plain == {0: (1580, 1582, 1579), 2: (1580, 1582, 1579)}


def test_a_truncated_gzip_keeps_what_was_read_and_says_so(tmp_path):
    packed = gzip.compress(("noise line\n" * 20000 + waits(0)).encode())
    evidence = read_logs([_write(tmp_path / "cut.log.gz", packed[: len(packed) - 20])])
    assert any("truncated" in note or "damaged" in note for note in evidence.notes)


def test_a_cut_off_last_line_never_reads_half_a_number(tmp_path):
    text = waits(0) + waits(1)[:-1]  # the newline is gone
    cut = text[: text.rfind("last completed work: 1579") + len("last completed work: 15")]
    evidence = read_logs([_write(tmp_path / "job.log", cut.encode())])
    assert evidence.files[0].partial_last_line
    assert evidence.ranks[1].groups["0"].last_completed is None
    assert evidence.ranks[1].groups["0"].last_enqueued == 1582
    assert evidence.ranks[0].groups["0"].last_completed == 1579


def test_progress_bars_colour_and_binary_noise_hide_no_line(tmp_path):
    text = ("Epoch 1:  45%|\x1b[32m####\x1b[0m | 45/100\r" + waits(0)
            + "\x00\xff\xfe garbage \x80\x81\n".encode("latin-1").decode("latin-1")
            + "\x1b[31m" + waits(1).replace(" failure", "\x1b[0m failure"))
    data = text.encode("utf-8", "surrogateescape") + bytes(range(256)) + b"\n" + waits(2).encode()
    evidence = read_logs([_write(tmp_path / "job.log", data)])
    assert positions(evidence) == {r: (1580, 1582, 1579) for r in (0, 1, 2)}


@pytest.mark.parametrize("block", [64, 333, 4096])
def test_block_boundaries_change_nothing(tmp_path, block):
    path = _write(tmp_path / "job.log", one_file(job_logs(8, era="2.6", noise=20, garble=True)))
    whole = list(read_marked_lines(str(path), StreamStats()))
    assert list(read_marked_lines(str(path), StreamStats(), block_size=block)) == whole
    assert positions(read_logs([path], block_size=block)) == positions(read_logs([path]))


def test_a_huge_line_is_read_around_its_marker(tmp_path):
    data = b"x" * 300_000 + waits(0).encode() + b"y" * 300_000 + b"\n" + waits(1).encode()
    evidence = read_logs([_write(tmp_path / "job.log", data)], block_size=1 << 16)
    assert 1 in evidence.ranks and evidence.ranks[1].groups["0"].failed_at == 1580


def test_a_large_log_is_read_in_bounded_memory(tmp_path):
    noise = b"step 12 loss 1.234 lr 3e-4 tokens/s 123456 mfu 0.41 [rank0]: nothing to see here\n" * 12_000
    path = tmp_path / "big.log"
    with open(path, "wb") as handle:
        for _ in range(25):  # about 25 MB
            handle.write(noise)
        handle.write(waits(0).encode())
    tracemalloc.start()
    evidence = read_logs([path], block_size=1 << 20)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert evidence.ranks[0].groups["0"].failed_at == 1580
    assert peak < 8 << 20  # a few blocks, not the file


def test_two_runs_in_one_file_read_the_last(tmp_path):
    first = job_logs(8, era="2.6", fault="never_arrives", culprits=(2,), seed=1)
    second = job_logs(8, era="2.6", fault="never_arrives", culprits=(5,), seed=2, nccl_info=False)
    restart = b"[2024-03-21 02:20:00,000] torch.distributed.elastic.agent.server.api: [INFO] [default] Starting worker group\n"
    evidence = read_logs([_write(tmp_path / "job.log", one_file(first) + restart + one_file(second))])
    assert evidence.files[0].generations == 2
    assert any("holds 2 runs" in note for note in evidence.notes)
    told = sorted(r for r, log in evidence.ranks.items() if log.groups.get("0") and log.groups["0"].told)
    assert told == [5]


def test_a_restart_without_a_launcher_line_is_told_by_the_nccl_banner(tmp_path):
    first = one_file(job_logs(4, era="2.6", fault="crash", culprits=(1,), seed=3))
    second = one_file(job_logs(4, era="2.6", fault="healthy", seed=4))
    evidence = read_logs([_write(tmp_path / "job.log", first + second)])
    assert evidence.files[0].generations == 2
    assert all(log.ending is None and not log.failed for log in evidence.ranks.values())


def test_a_combined_log_without_prefixes_is_split_by_the_rank_each_line_names(tmp_path):
    text = "".join(waits(r).replace(f"[rank{r}]:", "") for r in (0, 1, 3))
    evidence = read_logs([_write(tmp_path / "plain.log", text.encode())])
    assert sorted(positions(evidence)) == [0, 1, 3]


def test_srun_labels_of_a_node_running_several_ranks(tmp_path):
    lines = [f"0: {line}" for r in (0, 1, 2, 3) for line in waits(r).replace(f"[rank{r}]:", "").splitlines()]
    evidence = read_logs([_write(tmp_path / "slurm-77.out", ("\n".join(lines) + "\n").encode())])
    assert sorted(positions(evidence)) == [0, 1, 2, 3]


def test_local_labels_on_two_nodes_read_the_global_rank_from_the_default_group(tmp_path):
    text = waits(11).replace("[rank11]:", "[default3]:") + waits(3).replace("[rank3]:", "[default3]:")
    evidence = read_logs([_write(tmp_path / "node02.log", text[: len(text) // 2].encode()),
                          _write(tmp_path / "node01.log", text[len(text) // 2:].encode())])
    assert sorted(positions(evidence)) == [3, 11]


def test_a_rank_whose_file_holds_no_failure_still_logged(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs / "rank_0.log", waits(0).replace("[rank0]:", "").encode())
    _write(logs / "rank_1.log", b"step 1 loss 2.0\nstep 2 loss 1.9\n")
    evidence = read_logs([logs])
    assert sorted(evidence.ranks) == [0, 1] and not evidence.ranks[1].failed
    assert evidence.silent_ranks == ()


def test_hosts_from_nccl_lines_the_launcher_summary_and_file_names(tmp_path):
    job = job_logs(16, era="2.6", fault="crash", culprits=(9,), layout="combined")
    evidence = read_logs([write_job_logs(job, tmp_path / "a")])
    assert evidence.ranks[9].host == "node02" and evidence.ranks[0].host == "node01"
    nodes = job_logs(16, era="2.6", fault="never_arrives", culprits=(9,), layout="per_node", nccl_info=False)
    by_name = read_logs([write_job_logs(nodes, tmp_path / "b")])
    assert by_name.ranks[9].host == "node02" and by_name.ranks[9].host_from.startswith("the name")
    summary = ("Root Cause (first observed failure):\n[0]:\n  time      : 2024-03-21_02:17:09\n  host      : gpu-a17\n"
               "  rank      : 6 (local_rank: 6)\n  exitcode  : -9 (pid: 4006)\n")
    killed = read_logs([_write(tmp_path / "c.log", (waits(0) + summary).encode())])
    assert killed.ranks[6].host == "gpu-a17" and killed.ranks[6].exit_code == -9
    assert killed.ranks[6].ending is not None and not killed.ranks[6].ending.collateral
    assert killed.launcher_first_failure == 6


def test_counters_torch_printed_before_setting_them_are_left_out(tmp_path):
    line = ("[rank7]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 7] Timeout at NCCL work: 1, last enqueued NCCL work: 1, "
            "last completed NCCL work: 3452013982.\n")
    position = read_logs([_write(tmp_path / "job.log", line.encode())]).ranks[7].groups["0"]
    assert position.last_completed is None and position.discarded == ["last completed 3452013982"]


def test_no_log_and_not_a_log(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LogInputError):
        read_logs([empty])
    with pytest.raises(LogInputError):
        read_logs([_write(tmp_path / "rank_0.pkl", b"\x80\x02}q\x00X\x07\x00\x00\x00versionq\x01X\x03\x00\x00\x002.10q")])


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_lines_a_terminal_wrapped_are_joined_again(tmp_path):
    text = waits(1)
    width = 120
    wrapped = "".join(line[i:i + width] + "\n" for line in text.splitlines() for i in range(0, len(line), width))
    nccl = "node01:4001:4041 [1] NCCL INFO comm 0x55d2c rank 1 nranks 8 cudaDev 1 busId 18000 - Init COMPLETE\n"
    evidence = read_logs([_write(tmp_path / "job.log", (nccl + wrapped + nccl).encode())])
    position = evidence.ranks[1].groups["0"]
    assert position.timed_out.work == (1580, "ALLREDUCE", 8, 8, 600000, None)
    assert (position.failed_at, position.last_enqueued, position.last_completed) == (1580, 1582, 1579)
    assert evidence.ranks[1].host == "node01"


def test_a_whole_job_log_pasted_at_a_terminal_s_width(tmp_path):
    from frtrace.diagnosis.logs import diagnose_logs

    text = one_file(job_logs(8, era="2.6", fault="never_arrives", culprits=(6,), noise=0)).decode()
    wrapped = "".join(line[i:i + 100] + "\n" for line in text.splitlines() for i in range(0, max(len(line), 1), 100))
    diagnosis = diagnose_logs(read_logs([_write(tmp_path / "pasted.log", wrapped.encode())]))
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (6,)
