"""The entry table: how one rank's entries are held, and the questions asked of them.

Takes normalised entries (from `load`); returns `EntryTable` (a rank's entries as
columns and shared static rows), `RankDump` (a table with what the dump says of its
groups), `SeqMap` (a group's collectives by sequence number), and facts about where a
rank stands (`standing`) and its coalesced batches (`batches`). Only this package reads
a table's internals; the layers above ask it named questions.
"""
