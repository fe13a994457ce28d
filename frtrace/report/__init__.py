"""Reports: pure functions of an `Analysis` and its `Diagnosis`.

Takes an `Analysis` and a `Diagnosis`; returns text, JSON, markdown (`render`), HTML
(`html`), the per-rank view (`rank_view`), the raw `-j` view (`raw_view`), and the
`frtrace diff` comparison of two analyses (`progress_diff`, rendered by `diff_render`).
"""
