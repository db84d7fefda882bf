"""One error hierarchy for cdigen.

Every error carries the exit code the CLI should return and renders as one line:
what went wrong, where, and what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


def shortened(text: str, limit: int = 60) -> str:
    """``text`` cut to at most ``limit`` characters, ending in "..." when cut: a value quoted in
    an error stays one short line however long the input."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str, limit: int | None = None) -> str:
    """``text`` safe to print on a terminal or in a log line: every character Python does not
    count printable (control characters C0, DEL and C1 such as ``\\n`` and ``\\x1b``, and the
    invisible format ones such as U+202E that reorder a line) and every backslash written as a
    Python escape (``\\n``, ``\\x1b``, ``\\u202e``, ``\\\\``), as ``repr`` writes them, so a name
    read from outside (an API object, a file) can neither forge a line nor drive the terminal,
    and an escape in the output always means the name held one. Printable text, any script's
    letters included, is unchanged. With ``limit``, the result is at most that long, ending in
    "..." when cut (never inside an escape). The one rule for every name printed from outside."""
    if text.isprintable() and "\\" not in text:
        return text if limit is None else shortened(text, limit)
    out: list[str] = []
    size = 0
    for ch in text:
        if ch == "\\":
            piece = "\\\\"
        elif ch.isprintable():
            piece = ch
        else:
            piece = ch.encode("unicode_escape").decode("ascii")
        if limit is not None and size + len(piece) > limit:
            while out and size > limit - 3:  # whole escapes only, then "..."
                size -= len(out.pop())
            return "".join(out) + "..."
        out.append(piece)
        size += len(piece)
    return "".join(out)


def first_of(problems: Sequence[str]) -> str:
    """The first of ``problems`` and how many follow: ``gpus[0].uuid: ... (and 2 more)``."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def close_match(word: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` that ``word`` most likely misspells (case first), or None."""
    import difflib

    by_case = [k for k in known if k.lower() == word.lower()]
    if by_case:
        return by_case[0]
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75)
    return close[0] if close else None


class CdigenError(Exception):
    """Base of all errors cdigen reports to users; ``str()`` is the one-line message."""

    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        """The message as one line: ``where: message (hint)``."""
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text = f"{text}; {self.hint}"
        return " ".join(text.split())


class InputError(CdigenError):
    """Bad input from the user: a missing or malformed file, a bad flag value."""


class FlagError(InputError):
    """A bad value given on the command line (or in the environment variable standing in for
    the flag): bad usage, whatever a config file beside it says."""


class ContentError(InputError):
    """Bad input whose message quotes the input itself (a value, a key): fine for the user who
    gave it on the command line, never for a log line, where :meth:`redacted` stands in: the
    file, the field and the hint, nothing of the content."""

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        hint: str | None = None,
        field: str | None = None,
    ) -> None:
        self.field = field
        super().__init__(message, where=where, hint=hint)

    def redacted(self) -> str:
        """The error as one line without the quoted content."""
        at = ": ".join(part for part in (self.where, self.field) if part)
        text = f"{at}: not valid (the log never quotes an input's content)"
        if self.hint:
            text = f"{text}; {self.hint}"
        return printable(" ".join(text.split()))


class SchemaError(ContentError):
    """A document failed its JSON Schema; ``where`` names the file, ``field`` the first bad
    field's path."""


class DiscoveryError(CdigenError):
    """Discovery could not run at all (for example: no NVML library)."""


class SpecConflictError(CdigenError):
    """Another CDI spec already defines a device name we would write."""


class WriteError(CdigenError):
    """Writing a file failed; the previous file is left as it was."""


class CheckFailed(CdigenError):
    """A check (validate, policy check) found problems; each is listed in ``problems``."""

    exit_code = EXIT_CHECK_FAILED

    def __init__(
        self, problems: list[str], *, summary: str = "check failed", exit_code: int | None = None
    ) -> None:
        self.problems = problems
        if exit_code is not None:  # 2 when one of the problems is input that cannot be read
            self.exit_code = exit_code
        super().__init__(f"{summary}: {len(problems)} problem(s)")


class AllocationError(CdigenError):
    """A request that cannot be met (asks for more devices than are available)."""
