"""The simulator's user-error type: a bad arch file, program file or program."""


class SimulatorError(Exception):
    """A message for a person (names the file, field or instruction); the CLI exits with 2."""


class IndexRangeError(SimulatorError):
    """An index the indexed DMA read is outside its table: the machine names the input binding
    that holds `address`, when one does."""

    def __init__(self, message: str, address: int, index: int, size: int, sample: int = 0):
        super().__init__(message)
        self.address, self.index, self.size = address, index, size
        self.sample = sample  # which sample of a batched run held it


def listing(names, limit: int = 10, quote: bool = False, sep: str = ", ") -> str:
    """Names for a one-line message, `a, b, c`, or past `limit` the first few and a count,
    `a, b, ..., (40 in all)`: a model with hundreds of nodes never makes a 3,000-character
    error. With `quote`, each name in single quotes, as messages quote one node's name."""
    shown = [f"'{n}'" if quote else str(n) for n in names]
    if len(shown) <= limit:
        return sep.join(shown)
    return sep.join(shown[:limit]) + f"{sep}... ({len(shown)} in all)"
