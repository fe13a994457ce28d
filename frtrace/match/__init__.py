"""Matching: operations paired across ranks per group by sequence number.

Takes `RankDump`s and a `Layout`; returns a `MatchResult` (`matcher.match`): a
`CollectiveMatch` per (group, collective_seq_id), a `P2PMatch` per send/recv pair.
`analysis.analyze` runs load, layout and match and returns the `Analysis` the
diagnosis reads.
"""
