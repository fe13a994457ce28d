"""The line grammar of a distributed PyTorch job's logs: what one line says.

Takes one decoded line (ANSI colour already removed); returns its logical segments, each
with the prefixes that say whose line it is (`srun --label`'s `N: `, torchrun's
`[rankN]:` or `[defaultN]:`, Ray's `(Worker pid=.., ip=..)`) and the events its message
holds: a watchdog timeout with its `WorkNCCL(...)`, the watchdog's status line (last
enqueued / started / completed work), a told-to-dump signal, the heartbeat monitor, a
group's init options, an NCCL line with its `host:pid:tid [device]` prefix, a Python
traceback and the exception that ended it, gloo timeouts, and torchrun's failure summary.

Every wording PyTorch wrote from 1.x to today is listed in docs/logs.md with the version
that wrote it; the patterns below accept all of them (and the same lines from the
vendor forks that print `HCCL`, `XCCL`, ... for `NCCL`). Pure functions, no state: the
collector (`collect.py`) decides what the events mean together.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Iterable, NamedTuple, Optional, Union

# --------------------------------------------------------------------------- prefixes

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\x1b[=>]")
_SLURM_TASK = re.compile(r"^\s{0,6}(\d{1,6}): ")
# pdsh (DeepSpeed's multi-node launcher) and `mpirun --tag-output`-like tools: `worker-3: [rank9]:...`
_HOST_TAG = re.compile(r"^([a-z][a-z0-9-]*\d[a-z0-9.-]*|\d{1,3}(?:\.\d{1,3}){3}): (?=\[)")
# torchrun: `[rank3]:` (global rank), `[default3]:` / `[trainer3]:` (role and local rank),
# `[3]:` (a `[${rank}]:` template). A bare `[0]:` line is a failure summary's index.
_LABEL = re.compile(r"\[([A-Za-z][A-Za-z_-]*?)?(\d{1,7})\]:(?=.)")
_RAY = re.compile(r"\((\w+) pid=(\d+)(?:, ip=([0-9A-Fa-f.:]+))?\)")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


class Prefix(NamedTuple):
    """Whose line: every field None when the line does not say."""

    task: Optional[int] = None  # srun --label's task number
    host: Optional[str] = None  # pdsh's `host: ` tag
    label: Optional[str] = None  # "rank" (global) | "local" (a role's local rank)
    label_rank: Optional[int] = None
    ray_pid: Optional[int] = None
    ray_ip: Optional[str] = None


def segments(line: str) -> list[tuple[Prefix, str]]:
    """The line's logical lines: output of several ranks written without a newline between
    them (or pasted onto one line) starts a segment at each `[rankN]:` label."""
    task, host = None, None
    match = _HOST_TAG.match(line)
    if match:
        host = match.group(1)
        line = line[match.end():]
    match = _SLURM_TASK.match(line)
    if match:
        task = int(match.group(1))
        line = line[match.end():]
    labels = list(_LABEL.finditer(line))
    ray = _RAY.search(line)
    ray_pid, ray_ip = (int(ray.group(2)), ray.group(3)) if ray else (None, None)
    if not labels:
        return [(Prefix(task, host, None, None, ray_pid, ray_ip), line)]
    found = []
    for index, label in enumerate(labels):
        end = labels[index + 1].start() if index + 1 < len(labels) else len(line)
        role = (label.group(1) or "rank").lower()
        kind = "rank" if role == "rank" else "local"
        text = line[label.end():end]
        found.append((Prefix(task, host, kind, int(label.group(2)), ray_pid, ray_ip), text[1:] if text.startswith(" ") else text))
    return found


# --------------------------------------------------------------------------- times

# c10's own format (torch 2.4+): `[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]`;
# before that `[E ProcessGroupNCCL.cpp:828]` (no time); glog builds: `E0321 02:07:08.408271 123 file.cpp:607]`.
_C10_HEADER = re.compile(r"\[([IWEF])(?:(\d{3,4}) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?)? ?([\w.-]+\.(?:cpp|cc|cu|h|hpp)):\d+\]")
_GLOG_HEADER = re.compile(r"\b([IWEF])(\d{4}) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s+\d+ ([\w.-]+\.(?:cpp|cc|cu|h|hpp)):\d+\]")
_ISO_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")
_EPOCH = datetime(2000, 1, 1)


def seconds(month: int, day: int, hour: int, minute: int, second: int, fraction: str = "") -> Optional[float]:
    """A time on the job's clock in seconds. The year is left out (c10's lines do not
    carry one): only differences within a job mean anything."""
    try:
        moment = datetime(2000, month, day, hour, minute, second)
    except ValueError:
        return None
    return (moment - _EPOCH).total_seconds() + (float("0." + fraction) if fraction else 0.0)


class Header(NamedTuple):
    level: str  # I W E F, "" when the line has no c10 header
    source_file: str  # ProcessGroupNCCL.cpp, ...
    at: Optional[float]
    has_c10_time: bool  # the c10 header carried a time (torch 2.4+)


def header(text: str) -> Header:
    match = _C10_HEADER.search(text)
    if match:
        level, mmdd, hh, mi, ss, frac, source = match.groups()
        at = seconds(int(mmdd[:-2]), int(mmdd[-2:]), int(hh), int(mi), int(ss), frac or "") if mmdd else None
        if at is None:
            at = _iso_time(text)
        return Header(level, source, at, mmdd is not None)
    match = _GLOG_HEADER.search(text)
    if match:
        level, mmdd, hh, mi, ss, frac, source = match.groups()
        return Header(level, source, seconds(int(mmdd[:2]), int(mmdd[2:]), int(hh), int(mi), int(ss), frac or ""), True)
    return Header("", "", _iso_time(text), False)


def _iso_time(text: str) -> Optional[float]:
    match = _ISO_TIME.search(text) if "-" in text and ":" in text else None
    if not match:
        return None
    _, month, day, hh, mi, ss, frac = match.groups()
    return seconds(int(month), int(day), int(hh), int(mi), int(ss), frac or "")


# --------------------------------------------------------------------------- whose group

class PgRef(NamedTuple):
    name: str  # GUID (2.5+) or name (2.3, 2.4); "" for `[Rank N]` alone
    desc: str
    local_id: Optional[int]


# `[PG 1 Rank 0]` (2.3), `[PG 0 (default_pg) Rank 1]` (2.4), `[PG ID 0 PG GUID 0(default_pg) Rank 1]`
# and `[PG ID 1 PG GUID 1 Rank 1]` (2.5+).
_PG_PREFIX = re.compile(r"\[PG (?:ID (\d+) PG GUID )?([^\s()\[\]]+) ?(?:\(([^)]*)\))? ?Rank (\d+)\]")
_RANK_PREFIX = re.compile(r"\[Rank (\d+)\]")


def group_of(text: str) -> tuple[Optional[PgRef], Optional[int]]:
    """The process group and the rank within it that a watchdog line names."""
    match = _PG_PREFIX.search(text)
    if match:
        local_id, name, desc, rank = match.groups()
        return PgRef(name, desc or "", int(local_id) if local_id is not None else None), int(rank)
    match = _RANK_PREFIX.search(text)
    if match:
        return None, int(match.group(1))
    return None, None


def is_default_group(pg: Optional[PgRef]) -> bool:
    return pg is not None and (pg.desc == "default_pg" or (pg.name == "0" and pg.local_id in (None, 0)))


# --------------------------------------------------------------------------- events

class Timeout(NamedTuple):
    seq: Optional[int]
    op: str
    numel_in: Optional[int]
    numel_out: Optional[int]
    timeout_ms: Optional[int]
    tensor_shape: Optional[str]
    ran_for_ms: Optional[int]


class Status(NamedTuple):
    """The watchdog's line about a failed work and where its group stood."""

    at_seq: int
    failure: str  # timeout | error | ""
    last_enqueued: Optional[int]
    last_started: Optional[int]
    last_started_op: str
    last_completed: Optional[int]


class Signal(NamedTuple):
    """Told to dump: a failure somewhere (`from_rank`, or this rank itself)."""

    from_rank: Optional[int]
    by_itself: bool
    last_enqueued: Optional[int]
    last_completed: Optional[int]


class Heartbeat(NamedTuple):
    stuck_s: Optional[int]


class GroupInit(NamedTuple):
    size: int
    global_rank: Optional[int]


class Nccl(NamedTuple):
    host: str
    pid: int
    level: str  # INFO WARN ERROR ...
    comm_rank: Optional[int]  # from `comm 0x.. rank R nranks N` lines
    nranks: Optional[int]
    text: str
    starts_run: bool  # the `NCCL version` banner a process prints once


class TracebackStart(NamedTuple):
    pass


class ExceptionLine(NamedTuple):
    type: str
    message: str


class GlooTimeout(NamedTuple):
    timeout_ms: int


class PeerClosed(NamedTuple):
    address: str


class SummaryField(NamedTuple):
    """A field of torchrun's failure summary (`host : node01`, `rank : 3 (local_rank: 3)`)."""

    key: str
    value: str


class SummaryStart(NamedTuple):
    """torchrun's failure summary begins (`ChildFailedError`, `Root Cause (first observed failure):`)."""

    root_cause: bool


class Terminated(NamedTuple):
    """`terminate called after throwing an instance of 'c10::DistBackendError'`."""

    type: str


class RunStart(NamedTuple):
    """A launcher (re)starting its workers: the lines before belong to an earlier run."""


class WorldSize(NamedTuple):
    size: int


Event = Union[Timeout, Status, Signal, Heartbeat, GroupInit, Nccl, TracebackStart, ExceptionLine, GlooTimeout,
              PeerClosed, SummaryField, SummaryStart, Terminated, RunStart, WorldSize]

_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: Work\w*\((.*?)Timeout\(ms\)=(\d+)\)(?:\s*ran for (\d+) milli)?")
_WORK_FIELD = re.compile(r"(SeqNum|OpType|NumelIn|NumelOut)=([\w-]+)|TensorShape=(\[[^\]]*\])")
# `Timeout at NCCL work: N` (2.2-2.5), `Exception (either an error or timeout) detected by watchdog
# at work: N` (2.4, 2.5), `NCCL error is detected by watchdog at work: N`, `Work timeout is detected
# by watchdog at work: N`, ` failure detected by watchdog at work sequence id: N` (2.6+)
_STATUS = re.compile(r"(Timeout at|[Ee]rror is detected by watchdog at|timeout is detected by watchdog at|detected by watchdog at)"
                     r" (?:\w+ )?work(?: sequence id)?: (\d+)")
_ENQUEUED = re.compile(r"[Ll]ast enqueued (?:\w+ )?work: (-?\d+)")
_STARTED = re.compile(r"[Ll]ast started (?:\w+ )?work: (-?\d+)(?: ?\((\w+)\))?")
_COMPLETED = re.compile(r"[Ll]ast completed (?:\w+ )?work: (-?\d+)")
_SIGNAL = re.compile(r"Received a (?:dump signal|global timeout)[^.]*? from\s+(?:rank (\d+)|(this local rank)|another rank)"
                     r"|Observed flight recorder dump signal from another rank"
                     r"|detected a collective timeout on some other rank")
_HEARTBEAT = re.compile(r"Heartbeat monitor timed out|watchdog got stuck for (\d+) seconds|detected no heartbeat of its watchdog")
_GROUP_INIT = re.compile(r"initialization options: .*?\bsize: (\d+), global rank: (\d+)")
_NCCL = re.compile(r"(?:^|[\s\]:])([A-Za-z0-9][\w.-]*):(\d+):(\d+) \[(\d+)\] NCCL (INFO|WARN|ERROR|ABORT|TRACE)\b ?(.*)")
_COMM = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) n[Rr]anks (\d+)")
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (?:send|recv) operation to complete")
_PEER_CLOSED = re.compile(r"Connection closed by (?:remote )?peer \[?([^\]\s<>]+)\]?")
_SUMMARY = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*: (.*)$")
_TERMINATED = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_RUN_START = re.compile(r"Starting worker group|Rendezvous'?ing worker group|[Rr]estarting worker group|Restarting workers")
_WORLD = re.compile(r"global_world_sizes=\[(\d+)")
# Exceptions that end in a dotted name ending this way, or a known one.
_EXCEPTION_NAMES = ("Error", "Exception", "Interrupt", "Exit", "Failure", "Timeout")


def events(text: str) -> list[Event]:
    """Every event one segment's text holds (most hold none)."""
    found: list[Event] = []
    if "NCCL " in text:
        nccl = _nccl(text)
        if nccl is not None:
            return [nccl]
    if "Watchdog caught" in text:
        match = _TIMEOUT.search(text)
        if match:
            found.append(_timeout(match))
    if "by watchdog at" in text or "Timeout at " in text:
        match = _STATUS.search(text)
        if match:
            found.append(_status(match, text))
    if "dump signal" in text or "global timeout" in text or "some other rank" in text:
        match = _SIGNAL.search(text)
        if match:
            found.append(Signal(int(match.group(1)) if match.group(1) else None, bool(match.group(2)),
                                _int_of(_ENQUEUED, text), _int_of(_COMPLETED, text)))
    if "eartbeat" in text or "got stuck" in text:
        match = _HEARTBEAT.search(text)
        if match:
            found.append(Heartbeat(int(match.group(1)) if match.group(1) else None))
    if "initialization options" in text:
        match = _GROUP_INIT.search(text)
        if match:
            found.append(GroupInit(int(match.group(1)), int(match.group(2))))
    if found:
        return found
    return _other(text)


def _other(text: str) -> list[Event]:
    if text.startswith("Traceback (most recent call last)"):
        return [TracebackStart()]
    if "Timed out waiting" in text:
        match = _GLOO_TIMEOUT.search(text)
        if match:
            return [GlooTimeout(int(match.group(1)))]
    if "Connection closed by" in text:
        match = _PEER_CLOSED.search(text)
        if match:
            return [PeerClosed(match.group(1))]
    if "ChildFailedError" in text or "Root Cause (first observed failure)" in text or text.strip() == "Failures:":
        return [SummaryStart("Root Cause" in text)]
    if "terminate called" in text:
        match = _TERMINATED.search(text)
        if match:
            return [Terminated(match.group(1))]
    match = _SUMMARY.match(text)
    if match:
        return [SummaryField(match.group(1), match.group(2).strip())]
    if _RUN_START.search(text):
        return [RunStart()]
    if "global_world_sizes" in text:
        match = _WORLD.search(text)
        if match:
            return [WorldSize(int(match.group(1)))]
    exception = exception_line(text)
    return [exception] if exception is not None else []


def exception_line(text: str) -> Optional[ExceptionLine]:
    """`RuntimeError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`: a line at
    column 0 that names an exception (the collector only asks after a traceback)."""
    if not text or not (text[0].isalpha() or text[0] == "_"):
        return None
    match = _EXCEPTION.fullmatch(text.rstrip())
    if not match:
        return None
    name = match.group(1)
    if not name.rsplit(".", 1)[-1].endswith(_EXCEPTION_NAMES):
        return None
    return ExceptionLine(name, (match.group(2) or "").strip())


def _int_of(pattern: re.Pattern[str], text: str) -> Optional[int]:
    match = pattern.search(text)
    return int(match.group(1)) if match else None


def _timeout(match: re.Match[str]) -> Timeout:
    fields: dict[str, str] = {}
    shape = None
    for field in _WORK_FIELD.finditer(match.group(1)):
        if field.group(3) is not None:
            shape = field.group(3)
        else:
            fields[field.group(1)] = field.group(2)
    return Timeout(_number(fields.get("SeqNum")), fields.get("OpType", "UNKNOWN"), _number(fields.get("NumelIn")),
                   _number(fields.get("NumelOut")), int(match.group(2)), shape,
                   int(match.group(3)) if match.group(3) else None)


def _number(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


def _status(match: re.Match[str], text: str) -> Status:
    said = match.group(1)
    failure = "timeout" if "imeout" in said else "error" if "rror" in said else ""
    started = _STARTED.search(text)
    return Status(int(match.group(2)), failure, _int_of(_ENQUEUED, text),
                  int(started.group(1)) if started else None, (started.group(2) or "") if started else "",
                  _int_of(_COMPLETED, text))


def _nccl(text: str) -> Optional[Nccl]:
    match = _NCCL.search(text)
    if not match:
        return None
    host, pid, _tid, _device, level, message = match.groups()
    comm = _COMM.search(message)
    return Nccl(host, int(pid), level, int(comm.group(1)) if comm else None, int(comm.group(2)) if comm else None,
                message.strip(), message.startswith("NCCL version"))


# --------------------------------------------------------------------------- which torch

class Wording(NamedTuple):
    text: str  # the wording, abridged
    first: tuple[int, int]  # the first torch version that wrote it
    last: Optional[tuple[int, int]]  # the last one (None: still written)


# Which torch wrote which wording (docs/logs.md gives the evidence for each row).
WORDINGS = {
    "work_no_seq": Wording("WorkNCCL(OpType=.., TensorShape=.., Timeout(ms)=..)", (1, 7), (1, 9)),
    "work_shape": Wording("WorkNCCL(SeqNum=.., OpType=.., TensorShape=.., Timeout(ms)=..)", (1, 10), (2, 0)),
    "work_numel": Wording("WorkNCCL(SeqNum=.., OpType=.., NumelIn=.., NumelOut=.., Timeout(ms)=..)", (2, 1), None),
    "header_untimed": Wording("[E ProcessGroupNCCL.cpp:N]", (1, 7), (2, 3)),
    "header_timed": Wording("[E0321 02:07:08.408271257 ProcessGroupNCCL.cpp:N]", (2, 4), None),
    "timeout_at": Wording("Timeout at NCCL work: N, last enqueued NCCL work: N, last completed NCCL work: N.", (2, 2), (2, 5)),
    "exception_at": Wording("Exception (either an error or timeout) detected by watchdog at work: N, last enqueued ..",
                            (2, 4), (2, 5)),
    "failure_at": Wording(" failure detected by watchdog at work sequence id: N PG status: last enqueued work: N, ..",
                          (2, 6), None),
    "last_started": Wording("PG status: .. last started work: N (OP) ..", (2, 13), None),
    "prefix_pg": Wording("[PG n Rank r]", (2, 3), (2, 4)),
    "prefix_pg_desc": Wording("[PG n (desc) Rank r]", (2, 4), (2, 4)),
    "prefix_pg_guid": Wording("[PG ID i PG GUID g(desc) Rank r]", (2, 5), None),
    "global_timeout": Wording("Received a global timeout from another rank and will start to dump the debug info.",
                              (2, 2), (2, 4)),
    "dump_signal": Wording("Received a dump signal due to a collective timeout from rank N ..", (2, 5), None),
    "heartbeat": Wording("Heartbeat monitor timed out! / watchdog got stuck for N seconds", (2, 2), None),
}


def wordings_of(event: Event, text: str, pg: Optional[PgRef], head: Header) -> list[str]:
    """The WORDINGS keys a watchdog line shows."""
    keys = []
    if isinstance(event, Timeout):
        keys.append("work_no_seq" if event.seq is None else "work_shape" if event.numel_in is None else "work_numel")
    elif isinstance(event, Status):
        keys.append("failure_at" if "sequence id" in text else "exception_at" if "either an error" in text
                    else "timeout_at" if "Timeout at" in text else "")
        if event.last_started is not None:
            keys.append("last_started")
    elif isinstance(event, Signal):
        keys.append("global_timeout" if "global timeout" in text else "dump_signal" if "dump signal" in text else "")
    elif isinstance(event, Heartbeat):
        keys.append("heartbeat")
    if pg is not None:
        keys.append("prefix_pg_guid" if pg.local_id is not None else "prefix_pg_desc" if pg.desc else "prefix_pg")
    if head.source_file:
        keys.append("header_timed" if head.has_c10_time else "header_untimed")
    return [key for key in keys if key]


def torch_versions(keys: Iterable[str]) -> str:
    """The torch versions that wrote every one of these wordings: `2.5`, `2.6+`, `2.4-2.5`;
    "" when they do not agree (two runs of different torch, or a fork)."""
    rows = [WORDINGS[key] for key in keys if key in WORDINGS]
    if not rows:
        return ""
    low = max(row.first for row in rows)
    ends = [row.last for row in rows if row.last is not None]
    high = min(ends) if ends else None
    if high is not None and high < low:
        return ""
    text = ".".join(map(str, low))
    if high is None:
        return text + "+"
    return text if high == low else f"{text}-{'.'.join(map(str, high))}"


# --------------------------------------------------------------------------- exceptions

# What an exception says when another rank's failure explains it: the launcher stopping
# the process, a communicator aborted after a timeout, a peer that went away.
_COLLATERAL = ("DistBackendError", "DistNetworkError", "DistStoreError", "SignalException", "ChildFailedError",
               "KeyboardInterrupt", "Watchdog caught collective operation timeout", "communicator was aborted",
               "is aborted", "Connection closed by", "Connection reset by peer", "Broken pipe", "recvBytes",
               "sendBytes", "recvValue", "Socket Timeout", "Timed out waiting", "remote process exited",
               "Connection refused", "failed to recv", "TCPStore", "watchdog thread terminated",
               "Some NCCL operations have failed or timed out", "NCCL timeout")
# ... unless it is about this rank's own device.
_OWN = ("CUDA error", "cuda error", "out of memory", "illegal memory access", "device-side assert", "ECC",
        "unhandled cuda error", "CUBLAS_STATUS", "cuDNN error")


def is_collateral(kind: str, message: str) -> bool:
    text = f"{kind}: {message}"
    if any(mark in text for mark in _OWN):
        return False
    return any(mark in text for mark in _COLLATERAL)


_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def exit_text(code: int) -> str:
    """`signal 9 (SIGKILL)` for torchrun's negative exit codes, else `exit code N`."""
    if code < 0:
        return f"signal {-code} ({_SIGNAL_NAMES.get(-code, 'SIG?')})"
    return f"exit code {code}"


def exit_is_collateral(code: int) -> bool:
    """SIGABRT is the watchdog taking the process down after a timeout, SIGTERM/SIGINT the
    launcher stopping the rest; SIGKILL (the OOM killer), SIGSEGV, SIGBUS and a Python
    exit code began with the rank itself."""
    return code in (-6, -15, -2, -1)
