"""A profile's calibration run made again on another form of its model.

The accuracy budget tries cross-layer equalization by itself (`ember.budget`): the equalized
model needs a profile of its own, made on the very samples the given one was (calibrating on
the evaluation data would grade the search on its own answers). A profile records each run's
data (kind, path, preprocessing, digest) and options, so the run can be made again: the data
found where the profile says (as given, else beside the profile), read the same way, and
checked by its digest to be the same samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

import onnx

from ember.cluster import Cluster, Where
from ember.errors import EmberError
from profiler.batching import Source
from profiler.errors import ProfileError
from profiler.format import Profile
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources import arrays, images, open_data, python_hook


class NotAgain(Exception):
    """Why the run cannot be made again, in words (no error: the budget goes on without)."""


def profile_again(model: onnx.ModelProto, profile: Profile, label: str,
                  where: Where = Where(), on_samples: Callable[[int], None] = lambda n: None
                  ) -> Profile:
    """`model` (another form of the model `profile` was made of) profiled on the profile's
    data with its options; raises NotAgain saying why when the profile's run cannot be made
    again or its data is no longer what it was."""
    from ember.flow import profile_model  # ember.flow imports the quantizer; keep this light

    if len(profile.runs) != 1:
        raise NotAgain(f"the profile merges {len(profile.runs)} runs")
    run = profile.runs[0]
    recorded, options = run["data"], run["options"]
    shapes = {name: tuple(dims) for name, dims in options["input_shapes"].items()
              if all(isinstance(d, int) for d in dims)}
    specs = input_specs(model, shapes)
    source = _source(recorded, specs, profile.path)
    run_options = RunOptions(batch=options["batch"], samples=options["samples"],
                             allow_nonfinite=options["allow_nonfinite"],
                             channel_means=options.get("channel_means", False))
    try:
        with Cluster(where) as cluster:
            again = profile_model(model, source, specs, run_options, shapes, on_samples, label,
                                  cluster)
    except (ProfileError, EmberError) as err:
        raise NotAgain(f"profiling it failed: {err}") from None
    if again.runs[0]["data"].get("sha256") != recorded.get("sha256"):
        raise NotAgain(f"{_where(recorded)} is not the data the profile was made from (its "
                       f"digest differs)")
    return again


def _source(recorded: Mapping, specs: Sequence, profile_path: str | None) -> Source:
    """The data source a run's record describes."""
    kind = recorded.get("kind")
    if recorded.get("synthetic"):
        raise NotAgain("the profile was made on synthetic --random data")
    if kind == "hook":
        try:
            return python_hook.Hook(recorded["hook"], list(specs))
        except (ProfileError, EmberError) as err:
            raise NotAgain(f"its data hook fails: {err}") from None
    if kind not in ("npz", "npy", "array-directory", "images"):
        raise NotAgain(f"its data is of a kind ({kind!r}) that cannot be read again")
    path = _found(recorded["path"], profile_path)
    options = images.ImageOptions()
    if kind == "images":
        options = images.ImageOptions(
            resize=tuple(recorded["resize"]), mean=tuple(recorded["mean"]),
            std=tuple(recorded["std"]), layout=recorded["layout"],
            channel_order=recorded["channel_order"])
    try:
        source = arrays.ArrayFile(path, list(specs)) if kind in ("npz", "npy") else \
            open_data(str(path), list(specs), options)
    except (ProfileError, EmberError) as err:
        raise NotAgain(f"its data cannot be read: {err}") from None
    return source


def _found(recorded: str, profile_path: str | None) -> Path:
    """The data's path: as recorded (from where the profile was made), else beside the
    profile."""
    path = Path(recorded)
    candidates = [path] if path.is_absolute() else \
        [path] + ([Path(profile_path).parent / path] if profile_path else [])
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise NotAgain(f"its data {recorded} is not there (nor beside the profile)")


def _where(recorded: Mapping) -> str:
    return str(recorded.get("path") or recorded.get("hook") or "its data")
