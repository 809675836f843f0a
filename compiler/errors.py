"""The compiler's user-facing error: bad models, unsupported operators, impossible targets."""


class CompileError(Exception):
    """A problem with the user's model or options; the message names the file, node or tensor."""
