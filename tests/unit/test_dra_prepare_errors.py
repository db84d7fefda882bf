"""A claim's error as the kubelet puts it in the pod's events: one line, at most
MAX_ERROR_CHARS (300) characters, cut with an ellipsis."""

from __future__ import annotations

from cdigen.plugin.dra.prepare import one_line


def test_an_error_is_one_line_of_at_most_300_characters() -> None:
    assert one_line("a\\n  b\\tc".replace("\\n", "\n").replace("\\t", "\t")) == "a b c"
    exact = "x" * 300
    assert one_line(exact) == exact
    long = "y" * 301
    cut = one_line(long)
    assert len(cut) == 300 and cut == "y" * 297 + "..."
    assert one_line("z" * 20, limit=10) == "z" * 7 + "..."
