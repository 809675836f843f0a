"""The simulator's user-error type: a bad arch file, program file or program."""


class SimulatorError(Exception):
    """A message for a person (names the file, field or instruction); the CLI exits with 2."""


def listing(names, limit: int = 10, quote: bool = False, sep: str = ", ") -> str:
    """Names for a one-line message, `a, b, c`, or past `limit` the first few and a count,
    `a, b, ..., (40 in all)`: a model with hundreds of nodes never makes a 3,000-character
    error. With `quote`, each name in single quotes, as messages quote one node's name."""
    shown = [f"'{n}'" if quote else str(n) for n in names]
    if len(shown) <= limit:
        return sep.join(shown)
    return sep.join(shown[:limit]) + f"{sep}... ({len(shown)} in all)"
