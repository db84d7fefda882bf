"""docs/troubleshooting.md names the containers the shipped DaemonSets have and quotes messages
the code prints (issue 26: it described init containers and a message that no longer exist)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
DOC_TEXT = " ".join(DOC.split())  # lines wrapped as prose
DEPLOY = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "deploy").rglob("*.yaml")))
CODE = "\n".join(
    p.read_text(encoding="utf-8")
    for folder in ("cdigen", "plugin", "policies")
    for p in sorted((REPO / folder).rglob("*.py"))
)
CODE_TEXT = re.sub(r'"\s*\n\s*f?"', "", CODE)  # string literals continued on the next line


def test_every_container_the_doc_names_is_in_a_daemonset() -> None:
    named = set(re.findall(r"-c ([a-z][a-z0-9-]*)", DOC))
    assert named, "the doc names the plugin's container"
    containers = set(re.findall(r"- name: ([a-z][a-z0-9-]*)\n\s+image:", DEPLOY))
    assert named <= containers, f"not in deploy/: {sorted(named - containers)}"
    assert "initContainers" not in DEPLOY and "init container" not in DOC.lower()


def test_no_setting_or_message_the_code_does_not_have() -> None:
    for gone in (r"\bDRIVER_ROOT\b", "NVML unavailable", "Init:Error"):
        assert not re.search(gone, DOC), gone
        assert not re.search(gone, CODE), gone


def test_the_start_up_messages_it_quotes_are_printed_by_the_code() -> None:
    for message in (
        "NVML library not found",
        "the driver is containerized: add --driver-root",
        "already defines",
        "runtimes drop devices defined in two files of one directory",
        "its NUMA node cannot be read",
        "the GPUs' memory is unknown and written as memoryBytes: 0",
    ):
        assert message in DOC_TEXT, message
        assert message in CODE_TEXT, message
