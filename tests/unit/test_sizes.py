"""One parser for every memory flag (cdigen/sizes.py): Kubernetes' spellings read as the CEL
engine's full parser reads them, the B spellings as people write them, bad ones one line."""

from __future__ import annotations

import pytest

from cdigen.errors import InputError
from cdigen.policies.cel import parse_quantity
from cdigen.sizes import parse_bytes, quantity_text

KUBERNETES = [
    *("1", "1024", "1Ki", "1536Mi", "24Gi", "1Ti", "2Pi", "1Ei", "1k", "24G", "3M", "1T"),
    *("2P", "1E", "1e9", "1E3", "1.5Gi", "0.5Ki", ".5Ki", "+4Gi", "1000m", "4e+3"),
]


@pytest.mark.parametrize("text", KUBERNETES)
def test_kubernetes_spellings_read_as_kubernetes_reads_them(text: str) -> None:
    assert parse_bytes(text, "--x") == parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("24GiB", 24 << 30), ("24gib", 24 << 30), ("24GB", 24 * 10**9), ("512B", 512),
     ("1.5 GiB", 3 << 29), ("81920MiB", 80 << 30), ("1KiB", 1024), ("2kb", 2000)],
)  # fmt: skip
def test_sizes_with_a_b(text: str, value: int) -> None:
    assert parse_bytes(text, "--x") == value


@pytest.mark.parametrize(
    "text", ["", "0", "-1Gi", "1.5", "lots", "1Gb2", " 1Gi", "1gi", "1e99999", "1Qi", "9" * 200]
)
def test_anything_else_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_bytes(text, "--memory-step")
    message = str(caught.value)
    assert message.startswith("--memory-step: ") and "\n" not in message
    assert "positive whole quantity of bytes" in message and "1GiB" in message


def test_quantity_text_is_canonical() -> None:
    assert [quantity_text(n) for n in (80 << 30, 24564 << 20, 1536, 1000)] == [
        "80Gi", "24564Mi", "1536", "1000"
    ]  # fmt: skip
    assert all(parse_bytes(quantity_text(n), "--x") == n for n in (1, 1023, 5 << 30, 6141 << 20))
