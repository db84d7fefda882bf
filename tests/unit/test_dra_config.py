"""GpuConfig opaque parameters (plugin/dra/config.py): which entry applies to which request,
and `cdigen dra check` holding DeviceClass and claim config to the same schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cdi.capabilities import CAPABILITIES
from cdigen.cli import main
from cdigen.errors import InputError
from cdigen.plugin.dra.claims import ClaimRef
from cdigen.plugin.dra.config import API_VERSION, KIND, claim_configs, config_for

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "examples" / "graphics-gpu.yaml"
DRIVER = "gpu.cdigen.dev"
REF = ClaimRef("ns", "uid", "c")


def _claim(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [], "config": list(entries)}}}}


def _entry(source: str, caps: list[str], *requests: str, driver: str = DRIVER) -> dict[str, Any]:
    params = {"apiVersion": API_VERSION, "kind": KIND, "capabilities": caps}
    doc: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests:
        doc["requests"] = list(requests)
    return doc


def test_claim_entries_win_over_class_entries_and_later_over_earlier() -> None:
    configs = claim_configs(
        _claim(
            _entry("FromClaim", ["video"], "a"),
            _entry("FromClass", ["graphics"]),
            _entry("FromClaim", ["display"], "a/sub"),
            _entry("FromClass", ["compute"], driver="other.example.com"),
        ),
        REF,
        driver=DRIVER,
    )
    assert [c.source for c in configs] == ["FromClass", "FromClaim", "FromClaim"]
    pick = {r: config_for(configs, r) for r in ("a", "a/sub", "a/other", "b")}
    assert {r: c.config.capabilities for r, c in pick.items() if c} == {
        "a": ("video",),
        "a/sub": ("display",),
        "a/other": ("video",),  # naming the main request covers its subrequests
        "b": ("graphics",),
    }
    assert config_for(claim_configs(_claim(), REF, driver=DRIVER), "a") is None


def test_all_means_every_capability_and_other_drivers_bad_config_is_ignored() -> None:
    (entry,) = claim_configs(
        _claim(
            _entry("FromClass", ["all"]),
            {"source": "FromClass", "opaque": {"driver": "x.example.com", "parameters": 7}},
        ),
        REF,
        driver=DRIVER,
    )
    assert entry.config.capabilities == CAPABILITIES and entry.config.every


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(InputError, match="unknown config source 'FromPod'"):
        claim_configs(_claim(_entry("FromPod", ["video"])), REF, driver=DRIVER)


def test_dra_check_holds_config_to_the_gpu_config_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dra", "check", str(EXAMPLE)]) == 0
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    docs[0]["spec"]["config"][0]["opaque"]["parameters"]["capabilities"] = ["graphix"]
    docs[1]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] = "Gpu"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    capsys.readouterr()
    assert main(["dra", "check", str(bad)]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "spec.config[0].opaque.parameters.capabilities[0]: expected one of" in text
    assert "spec.devices.config[0].opaque.parameters.kind" in text


def test_an_unknown_capability_device_flag_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["dra", "serve", "--node", "builtin:rtx4090", "--node-name", "n"]
    assert main([*argv, "--capability-devices", "graphics,graphix"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--capability-devices: unknown driver capability 'graphix'" in err


SHARING_EXAMPLE = EXAMPLE.parent / "mps-shared-gpu.yaml"


@pytest.mark.parametrize(
    ("sharing", "field", "message"),
    [
        ({"strategy": "Fair"}, "sharing.strategy", "expected one of TimeSlicing, MPS"),
        (
            {"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercentage": 20}},
            "sharing",
            "mpsConfig goes with strategy MPS, not TimeSlicing",
        ),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 120}},
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "greater than the maximum of 100",
        ),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}},
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "'lots' does not match",
        ),
    ],
)
def test_dra_check_refuses_a_bad_sharing_setting_naming_file_and_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sharing: dict[str, Any],
    field: str,
    message: str,
) -> None:
    assert main(["dra", "check", str(SHARING_EXAMPLE)]) == 0
    docs = list(yaml.safe_load_all(SHARING_EXAMPLE.read_text()))
    docs[0]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"] = sharing
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    capsys.readouterr()
    assert main(["dra", "check", str(bad)]) == 1
    out = capsys.readouterr()
    line = f"{bad}: spec.devices.config[0].opaque.parameters.{field}: "
    text = out.out + out.err
    assert any(ln.startswith(line) and message in ln for ln in text.splitlines()), text


def test_sharing_is_read_in_bytes_and_a_claim_keeps_one_setting() -> None:
    from cdigen.plugin.dra.config import ClaimSharing, claim_sharing

    mps = {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 30,
            "defaultPinnedDeviceMemoryLimit": "6Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "512Mi"},
        },
    }
    entry = _entry("FromClaim", [], "a")
    entry["opaque"]["parameters"]["sharing"] = mps
    configs = claim_configs(_claim(entry), REF, driver=DRIVER)
    expected = ClaimSharing("MPS", 30, 6 << 30, (("1", 512 << 20),))
    assert claim_sharing(configs, ["a"], "w") == expected
    # request b has no config (the node-wide setting): one claim cannot mix the two
    with pytest.raises(InputError, match=r"different sharing settings \(a: MPS, b: node-wide\)"):
        claim_sharing(configs, ["a", "b"], "w")
