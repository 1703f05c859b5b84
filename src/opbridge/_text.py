"""Text as a terminal shows it safely."""

from __future__ import annotations

__all__ = ["printable"]


def printable(line: str) -> str:
    """``line`` with every character a terminal would act on (control characters such as ESC or a
    newline, and invisible format characters such as a right-to-left override) written as its escape:
    names read from a model file are shown, never obeyed.

    Example:
        >>> printable("node\\x1b[2J")
        'node\\\\x1b[2J'
    """
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in line)
