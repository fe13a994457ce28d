"""The entry table: how one rank's entries are held, and the questions asked of them.

Takes normalised entries (from `load`); returns `EntryTable` (a rank's entries as
columns and shared static rows), `RankDump` (a table with what the dump says of its
groups), `SeqMap` (a group's collectives by sequence number), and facts about where a
rank stands (`standing`) and its coalesced batches (`batches`). Only this package reads
a table's internals (its codes, a SeqMap's rows and numbers); the layers above ask it
named questions, and get named answers (`StaticRow`, `OpKey`): tests/test_layers.py
checks. Each fast path has a plain twin beside it (`PLAIN_TWINS`, frtrace.testing.twins).
"""
