"""The image preprocessing that calibration used, recorded in the profile and the program
header, and the warning when later commands preprocess images otherwise."""

from __future__ import annotations

from dataclasses import fields

import click

from profiler.batching import Source
from profiler.format import Profile
from profiler.sources.images import ImageOptions, preprocessing
from simulator.program import Program


def profiled(profile: Profile) -> dict | None:
    """The preprocessing of the profile's image runs (None when it saw no images, or runs
    that disagree, which a warning could not name)."""
    found = {repr(p): p for run in profile.runs
             if (p := preprocessing(run["data"])) is not None}
    return next(iter(found.values())) if len(found) == 1 else None


def recorded_by(program: Program) -> dict | None:
    """The preprocessing a program header records (`ember compile` copies the profile's)."""
    record = program.metadata.get("preprocessing")
    return record if isinstance(record, dict) else None


def warn_if_differs(recorded: dict | None, images: ImageOptions, source: Source | None,
                    where: str) -> None:
    """One line on stderr when images are preprocessed otherwise than the calibration images
    were (`recorded`, from the profile or the program header): a model calibrated on
    normalised pixels and fed raw ones still runs, but its figures mean nothing. Likewise
    when image options are given for data that is not images (`source` None: an array
    file), which ignores them."""
    given = preprocessing(source.describe()) if source is not None else None
    if given is None:
        unused = [f"--{f.name.replace('_', '-')}" for f in fields(images)
                  if getattr(images, f.name) != getattr(ImageOptions(), f.name)]
        if unused:
            click.echo(f"ember: warning: {where}: only a folder of images uses "
                       f"{', '.join(unused)}; this data is arrays, taken as they are", err=True)
        return
    if recorded is None or given == recorded:
        return
    differing = [key for key in given if given[key] != recorded.get(key)]

    def shown(record: dict) -> str:
        return " ".join(f"--{key.replace('_', '-')} {_value(record.get(key))}"
                        for key in differing)
    click.echo(f"ember: warning: {where}: images preprocessed with {shown(given)}, but the "
               f"calibration images had {shown(recorded)}; give the same options, or the "
               f"results are for other inputs", err=True)


def _value(value) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


