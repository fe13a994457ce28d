"""The reports on stdout, one renderer per format, chosen by name from a registry.

Takes a `Diagnosis` or a `Diff` (the API's report objects) and the run's `RenderOptions`;
returns the text the command writes. A new format is one more registered function;
`--format` offers every registered name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from frtrace.api import Diagnosis, Diff


@dataclass(frozen=True)
class RenderOptions:
    mismatch_cap: Optional[int] = None
    verbose: bool = False
    color: bool = False
    width: Optional[int] = None  # the text report's columns (None: the report's default)
    show_all: bool = False  # every finding and row of the text report, not one screen


R = TypeVar("R")
Renderer = Callable[[R, RenderOptions], str]

# `frtrace --format F`, `frtrace --ranks --format F`, `frtrace diff --format F`
REPORTS: dict[str, Renderer[Diagnosis]] = {}
RANK_VIEWS: dict[str, Renderer[Diagnosis]] = {}
DIFF_REPORTS: dict[str, Renderer[Diff]] = {}


def registered(registry: dict[str, Renderer[R]], fmt: str) -> Callable[[Renderer[R]], Renderer[R]]:
    def register(renderer: Renderer[R]) -> Renderer[R]:
        registry[fmt] = renderer
        return renderer
    return register


@registered(REPORTS, "text")
def _text(diagnosis: Diagnosis, options: RenderOptions) -> str:
    return diagnosis.to_text(verbose=options.verbose, mismatch_cap=options.mismatch_cap, color=options.color,
                             width=options.width, show_all=options.show_all)


@registered(REPORTS, "json")
def _json(diagnosis: Diagnosis, options: RenderOptions) -> str:
    return diagnosis.to_json()


@registered(REPORTS, "markdown")
def _markdown(diagnosis: Diagnosis, options: RenderOptions) -> str:
    return diagnosis.to_markdown(mismatch_cap=options.mismatch_cap)


@registered(REPORTS, "ranks")
def _suspect_ranks(diagnosis: Diagnosis, options: RenderOptions) -> str:
    return diagnosis.ranks("ranks")


def _rank_view(fmt: str) -> Renderer[Diagnosis]:
    def render(diagnosis: Diagnosis, options: RenderOptions) -> str:
        return diagnosis.ranks(fmt, color=options.color, width=options.width)
    return render


for _fmt in REPORTS:
    RANK_VIEWS[_fmt] = _rank_view(_fmt)


@registered(DIFF_REPORTS, "text")
def _diff_text(diff: Diff, options: RenderOptions) -> str:
    return diff.to_text(color=options.color)


@registered(DIFF_REPORTS, "json")
def _diff_json(diff: Diff, options: RenderOptions) -> str:
    return diff.to_json()


@registered(DIFF_REPORTS, "markdown")
def _diff_markdown(diff: Diff, options: RenderOptions) -> str:
    return diff.to_markdown()
