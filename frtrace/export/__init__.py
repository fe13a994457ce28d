"""Exports: files written from an analysis, atomically and never over a dump.

Takes an `Analysis` (and its `Diagnosis`); writes the Database as a pickle of
`(types, db)` (`database`, `outputs`), SQLite (`sqlite`), a Perfetto timeline
(`timeline`); `paths` decides before anything is read whether an output may be written.
"""
