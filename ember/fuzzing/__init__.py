"""Fuzzing ember with hostile files, shared by the suite (tests/ember/test_fuzz.py) and the
campaign (benchmarks/fuzz.py): `mutate` holds the mutators (plain functions of the seed's bytes
and a `random.Random`), `sandbox` runs one `ember` command in a forked child under a memory and
time limit and judges how it ended, `targets` makes the seed files and names, per file kind,
the commands that read them."""
