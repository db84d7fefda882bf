"""What ``plugin serve`` loads before it registers (issue 36: registered within 300 ms): the
built-in policies need neither the CEL engine nor jsonschema, so a plugin on the default
policy starts without importing them; a policy with CEL still gets both (checked, compiled).
The built-in policy files are checked against the schema here, since the plugin loads them
without it."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from cdigen.policies.policy import BUILTIN_NAMES, check_policy_file

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("celpy", "cdigen.policies.cel", "jsonschema")


def _loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(result.stdout.split())


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_each_builtin_policy_file_passes_the_full_check(name: str) -> None:
    path = resources.files("cdigen.policies").joinpath("builtin", f"{name}.yaml")
    assert check_policy_file(str(path)) == []


def test_the_default_policy_and_its_engine_load_without_cel_or_jsonschema() -> None:
    code = (
        "from cdigen.discover import load_node\n"
        "from cdigen.plugin.deviceplugin.config import load_config\n"
        "from cdigen.plugin.deviceplugin.layout import plan_layout\n"
        "from cdigen.policies.policy_set import load_policy_set\n"
        "node = load_node('builtin:dgx-a100')\n"
        "config = load_config(None, flags={'node': 'builtin:dgx-a100'})\n"
        "layout = plan_layout(node, config, load_policy_set(None))\n"
        "assert layout.engine('nvidia.com/gpu').policy.name == 'default'\n"
    )
    assert _loaded_after(code) == set()


def test_a_policy_with_cel_still_imports_the_engine(tmp_path: Path) -> None:
    policy = tmp_path / "fast.yaml"
    policy.write_text(
        "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {name: fast}\n"
        "spec:\n  constraints: ['allocation.numaNodes.size() <= 1']\n"
    )
    code = f"from cdigen.policies.policy import load_policy\nload_policy({str(policy)!r})\n"
    assert _loaded_after(code) == {"celpy", "cdigen.policies.cel", "jsonschema"}
