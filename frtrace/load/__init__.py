"""Loading: from paths, archives and URLs to one `RankDump` per rank and the job's groups.

Takes paths (directories, files, archives, URLs); returns a `LoadResult` (dumps sorted by
rank, files skipped or unreadable, notes) via `loader.load_dumps`, and a `Layout`
(groups, memberships, world size) via `layout.build_layout`. Dumps are untrusted: every
file is decoded by an unpickler that refuses every class (`safe_decode`).
"""
