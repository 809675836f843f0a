"""A fuzzing campaign: ember's commands on mutated programs, profiles, ONNX models, data files and
architecture files for N minutes, with the suite's mutators and sandbox (`ember.fuzzing`).

    python benchmarks/fuzz.py --minutes 30 [--out DIR] [--seed S] [--keep 5]

Each case mutates one seed file (`ember.fuzzing.targets.TARGETS`, taken in turn) and runs the
commands a user would on it, each in a forked child with its address space capped and a time
limit. A command must end in exit 0 with outputs that read back, or in exit 2 with one line;
anything else (a traceback, exit 1, a signal, a hang, a memory error, a temporary file left
behind) is a failure. Prints one row per file kind: cases tried, cases that ran through (exit
0), cases refused cleanly (exit 2), failures. The first `--keep` failures of each kind are saved
under DIR/failures/KIND-N/ (the mutated file and a `repro.txt` with the commands and what went
wrong; the seed files they name are under DIR/seeds). Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ember.fuzzing import targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the seeds and failures [a new temporary folder]")
    parser.add_argument("--seed", default="0", help="the campaign's random seed")
    parser.add_argument("--keep", type=int, default=5, help="failures saved per file kind")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per command")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ember-fuzz-"))
    seeds = targets.make_seeds(out / "seeds")
    work = out / "case"
    tried, clean, refused, failed = Counter(), Counter(), Counter(), Counter()
    saved: list[Path] = []
    deadline = time.monotonic() + 60 * args.minutes
    n = 0
    while time.monotonic() < deadline:
        target = targets.TARGETS[n % len(targets.TARGETS)]
        shutil.rmtree(work, ignore_errors=True)
        case = targets.run_case(target, random.Random(f"{args.seed}:{n}"), seeds, work,
                                timeout_s=args.timeout)
        kind = target.kind
        tried[kind] += 1
        if case.failure:
            failed[kind] += 1
            print(f"case {n} ({target.seed}): ember {' '.join(case.failure.args)}: "
                  f"{case.failure.failure}", file=sys.stderr, flush=True)
            if failed[kind] <= args.keep:
                saved.append(_save(case, n, out / "failures" / f"{kind}-{n}"))
        elif all(code == 0 for code in case.exit_codes):
            clean[kind] += 1
        else:
            refused[kind] += 1
        n += 1
    shutil.rmtree(work, ignore_errors=True)
    print(f"{args.minutes:g} minutes, seed {args.seed!r}, {len(targets.TARGETS)} seed files")
    print()
    print("| file kind | cases | exit 0 | exit 2 | failures |")
    print("|---|---|---|---|---|")
    for kind in targets.KINDS:
        print(f"| {kind} | {tried[kind]:,} | {clean[kind]:,} | {refused[kind]:,} | "
              f"{failed[kind]:,} |")
    print(f"| all | {sum(tried.values()):,} | {sum(clean.values()):,} | "
          f"{sum(refused.values()):,} | {sum(failed.values()):,} |")
    if saved:
        print()
        print("Reproducers:")
        for path in saved:
            print(f"  {path}")
    sys.exit(1 if failed else 0)


def _save(case: targets.Case, n: int, folder: Path) -> Path:
    """The mutated file and a repro.txt: the case's seed, each command (to run in this folder)
    with how it ended, and the failure's output."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / case.target.case).write_bytes(case.data)
    failure = case.failure
    lines = [(f"case {n}: {case.target.kind} seed {case.target.seed}, mutated into "
             f"{case.target.case}"), f"failure: {failure.failure}", ""]
    for outcome in case.outcomes:
        lines.append(f"ember {' '.join(outcome.args)}   # exit {outcome.exit_code}, "
                     f"{outcome.seconds:.1f} s")
    lines += ["", "stdout:", failure.stdout[-4000:], "stderr:", failure.stderr[-4000:]]
    (folder / "repro.txt").write_text("\n".join(lines))
    return folder


if __name__ == "__main__":
    main()
