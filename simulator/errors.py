"""The simulator's user-error type: a bad arch file, program file or program."""


class SimulatorError(Exception):
    """A message for a person (names the file, field or instruction); the CLI exits with 2."""
