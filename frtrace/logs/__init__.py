"""A job's logs as evidence: where each rank stood when the watchdog fired.

Takes log paths (a combined launcher log, per-rank or per-node files, gzip'd or not);
returns a `LogEvidence` (see model.py): per rank and process group, the last enqueued,
started and completed work, the op it timed out in with its sizes and timeout and when,
whether another rank told it to dump, how its process ended, and its host. The
diagnosis (`frtrace.diagnosis.logs`) reasons on it as on dumps.

    grammar.py   what one line says (every wording torch wrote; docs/logs.md)
    stream.py    reading a file as a stream, only the lines worth parsing
    inputs.py    which files are logs, and the rank or host their names give
    collect.py   lines -> positions per rank and group (read_logs)
"""

from frtrace.logs.collect import read_logs
from frtrace.logs.inputs import LogInputError, LogSource, discover_logs, has_log_files, is_log_file
from frtrace.logs.model import (
    UNNAMED_GROUP,
    Ending,
    GroupPosition,
    LogEvidence,
    LogFile,
    Place,
    RankLog,
    TimedOut,
    Told,
    WorkAt,
)

__all__ = ["UNNAMED_GROUP", "Ending", "GroupPosition", "LogEvidence", "LogFile", "LogInputError", "LogSource", "Place",
           "RankLog", "TimedOut", "Told", "WorkAt", "discover_logs", "has_log_files", "is_log_file", "read_logs"]
