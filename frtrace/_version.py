"""The version of frtrace, in one place (the report footers, the JSON and SQLite meta)."""

__version__ = "0.1.0"
