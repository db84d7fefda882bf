"""The spec cache against the CDI library itself (``../shared/tools/bin/cdicheck``).

``cdigen list`` and ``cdicheck list`` must agree on the files that load, the device names and the
conflicts; ``SpecCache.edits_for`` and ``cdicheck inject`` on the injected device nodes, mounts
(in order) and env. Tests that need cdicheck skip, saying so, where ../shared is absent.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from cdigen.cdi.cache import SpecCache, UnresolvedDevices, load_state
from cdigen.cdi.validate import spec_problems
from cdigen.cli import main
from cdigen.fileio import parse_document
from tests.cdihost import shared_tool

CDICHECK = shared_tool("cdicheck")
needs_cdicheck = pytest.mark.skipif(
    CDICHECK is None, reason="needs ../shared/tools/bin/cdicheck (CI has it; a user's clone not)"
)


def cdicheck(*args: str) -> subprocess.CompletedProcess[str]:
    assert CDICHECK is not None
    return subprocess.run([CDICHECK, *args], capture_output=True, text=True, timeout=60)


def library_view(dirs: list[Path]) -> tuple[set[str], dict[str, str], dict[str, set[str]]]:
    """(files that fail to load, device -> spec file, conflicting device -> files) per cdicheck."""
    out = cdicheck("list", *map(str, dirs)).stdout
    failed = set(re.findall(r"^SPEC ERROR (\S+): failed to load CDI Spec", out, re.M))
    devices = dict(re.findall(r"^DEVICE (\S+) \(spec (\S+), cdiVersion", out, re.M))
    conflicts: dict[str, set[str]] = {}
    for path, name in re.findall(r'^SPEC ERROR (\S+): conflicting device "([^"]+)"', out, re.M):
        conflicts.setdefault(name, set()).add(path)
    return failed, devices, conflicts


def cdigen_view(
    dirs: list[Path], capsys: pytest.CaptureFixture[str]
) -> tuple[set[str], dict[str, str], dict[str, set[str]]]:
    """The same three, read from ``cdigen list``'s output."""
    main(["list", *(a for d in dirs for a in ("--spec-dir", str(d)))])
    failed: set[str] = set()
    devices: dict[str, str] = {}
    conflicts: dict[str, set[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        first, rest = line.split("\t", 1)
        if rest.startswith("FAILED TO LOAD: "):
            failed.add(first)
        elif rest.startswith("CONFLICT: defined in "):
            files = rest.removeprefix("CONFLICT: defined in ").split("; ")[0]
            conflicts[first] = set(files.split(", "))
        else:
            devices[first] = rest
    return failed, devices, conflicts


def spec(kind: str, devices: str, edits: str = "", version: str = "0.5.0") -> str:
    return f"cdiVersion: {version}\nkind: {kind}\n{edits}devices:\n{devices}"


def device(name: str, edits: str = "    env: [X=1]\n") -> str:
    return f"- name: {name}\n  containerEdits:\n{edits}"


RELATIVE = spec(  # the lint wants absolute container paths; runtimes do not
    "acme.com/tpu",
    device("t0", "    mounts:\n    - {hostPath: /etc/hostname, containerPath: lib/x}\n"),
)


@pytest.fixture
def messy(tmp_path: Path) -> list[Path]:
    """Two dirs with a conflict, broken files, a lint-rejected file, overlaps and ignored files."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "a.yaml").write_text(spec("acme.com/gpu", device("0") + device("1") + device("both")))
    (etc / "b.yaml").write_text(spec("acme.com/gpu", device("both") + device("b1")))
    (run / "c.yaml").write_text(spec("acme.com/gpu", device("both") + device("1")))  # run wins
    (etc / "broken.yaml").write_text("kind: [\n")
    (etc / "env.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "acme.com/xx",
                "devices": [{"name": "e", "containerEdits": {"env": ["NOEQUALS"]}}],
            }
        )
    )
    (etc / "unknown.yaml").write_text(spec("acme.com/yy", device("u")) + "extra: 1\n")
    (etc / "relative.yaml").write_text(RELATIVE)
    (etc / ".cdigen.lock").write_text("")
    (etc / "ignored.yml").write_text(spec("acme.com/zz", device("z")))
    (etc / "sub.yaml").mkdir()
    return [etc, run]


@needs_cdicheck
def test_list_agrees_with_the_cdi_library(
    messy: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    etc, run = messy
    assert spec_problems(parse_document(RELATIVE, where="RELATIVE"))  # the lint rejects it
    ours = cdigen_view(messy, capsys)
    assert ours == library_view(messy)
    failed, devices, conflicts = ours
    assert failed == {str(etc / n) for n in ("broken.yaml", "env.json", "unknown.yaml")}
    assert devices["acme.com/tpu=t0"] == str(etc / "relative.yaml")
    assert devices["acme.com/gpu=1"] == str(run / "c.yaml")
    assert conflicts == {"acme.com/gpu=both": {str(etc / "a.yaml"), str(etc / "b.yaml")}}


# One file each: (text, loads) where PyYAML, the lint or JSON differ from the library.
G = "acme.com/gpu"
CASES = {
    "int-name": (spec(G, device("0")), True),
    "sexagesimal-name": (spec(G, device("1:0")), True),
    "date-name": (spec(G, device("2001-01-01")), True),
    "bool-name": (spec(G, device("yes")), True),
    "float-name": (spec(G, device("1.50")), True),
    "folded-key": (spec(G, device("a")).replace("kind:", "Kind:"), True),
    "relative-mount": (RELATIVE, True),
    "node-without-type": (spec(G, device("a", "    deviceNodes: [{path: x}]\n")), True),
    "annotation-number": (spec(G, device("a"), "annotations: {n: 1}\n", "0.6.0"), True),
    "second-document": (spec(G, device("a")) + "---\nkind: 1\n", True),
    "duplicate-key": (spec(G, device("a")) + "kind: acme.com/gpu\n", False),
    "too-low-version": (
        spec(G, device("a", "    deviceNodes: [{path: /a, hostPath: /b}]\n"), "", "0.4.0"),
        False,
    ),
    "empty-edits": (spec(G, device("a", "    env: []\n")), False),
    "bad-node-type": (spec(G, device("a", "    deviceNodes: [{path: /a, type: x}]\n")), False),
    "empty-host-path": (spec(G, device("a", "    mounts: [{containerPath: /a}]\n")), False),
    "number-in-env": (spec(G, device("a", "    env: [1]\n")), False),
    "no-devices": ("cdiVersion: 0.5.0\nkind: acme.com/gpu\ndevices: []\n", False),
    "bad-hook": (spec(G, device("a", "    hooks: [{hookName: later, path: /bin/true}]\n")), False),
    "empty-file": ("", False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_loads(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    text, loads = CASES[case]
    (tmp_path / "spec.yaml").write_text(text)
    state = load_state([tmp_path])
    assert bool(state.devices) is loads and bool(state.errors) is not loads, state.errors
    if CDICHECK is not None:
        assert cdigen_view([tmp_path], capsys) == library_view([tmp_path])


# --- injection ---------------------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Real device nodes and mount sources for cdicheck to stat."""
    base = tmp_path / "host"
    for minor, name in enumerate(("ctl", "gpu0", "gpu1", "nic0")):
        (base / "dev").mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(base / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        except PermissionError:
            pytest.skip("mknod is not permitted here: the CDI library stats device nodes")
    for name in ("libcuda.so", "libnic.so", "conf", "conf2", "dir"):
        (base / name).write_text(name)
    return base


def overlapping_dirs(tmp_path: Path, host: Path) -> list[Path]:
    """Two specs whose edits overlap (same env keys, node paths and mount destinations)."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    h = str(host)

    def node(path: str, host_name: str) -> str:
        return f"{{path: {path}, hostPath: {h}/dev/{host_name}}}"

    def mount(source: str, target: str, *options: str) -> str:
        return (
            f"{{hostPath: {h}/{source}, containerPath: {target}, options: [{', '.join(options)}]}}"
        )

    gpu0 = f"    env: [GPU=0, SHARED=gpu0]\n    deviceNodes: [{node('/dev/g0', 'gpu0')}]\n"
    gpu1 = (
        "    env: [GPU=1]\n"
        f"    deviceNodes: [{node('/dev/g1', 'gpu1')}, {node('/dev/ctl', 'gpu1')}]\n"
    )
    gpu_spec = (
        "containerEdits:\n  env: [SHARED=gpu, A=1]\n"
        f"  deviceNodes: [{node('/dev/ctl', 'ctl')}]\n  mounts:\n"
        f"  - {mount('libcuda.so', '/usr/lib/x/libcuda.so', 'ro', 'bind')}\n"
        f"  - {mount('conf', '/etc/conf', 'bind')}\n"
        f"  - {mount('dir', '/usr', 'bind')}\n"
    )
    (etc / "gpu.yaml").write_text(
        spec("acme.com/gpu", device("0", gpu0) + device("1", gpu1), gpu_spec)
    )
    nic0 = (
        f"    env: [SHARED=nic]\n    deviceNodes: [{node('/dev/ctl', 'nic0')}]\n"
        f"    mounts: [{mount('conf2', '/etc/conf')}]\n"
    )
    nic_spec = f"containerEdits:\n  mounts:\n  - {mount('libnic.so', 'lib/nic.so')}\n"
    (run / "nic.yaml").write_text(spec("acme.com/nic", device("n0", nic0), nic_spec))
    return [etc, run]


REQUESTS = [
    ["acme.com/gpu=0"],
    ["acme.com/gpu=1", "acme.com/gpu=0"],
    ["acme.com/gpu=0", "acme.com/nic=n0"],
    ["acme.com/nic=n0", "acme.com/gpu=1", "acme.com/gpu=0"],
]


@needs_cdicheck
@pytest.mark.parametrize("names", REQUESTS, ids=lambda n: "+".join(n))
def test_edits_agree_with_injection(tmp_path: Path, host: Path, names: list[str]) -> None:
    dirs = overlapping_dirs(tmp_path, host)
    run = cdicheck("inject", ",".join(map(str, dirs)), *names)
    assert run.returncode == 0, run.stdout + run.stderr
    oci = json.loads(run.stdout[run.stdout.index("{") : run.stdout.rindex("}") + 1])
    edits = SpecCache(dirs).edits_for(names)
    assert list(edits.env) == oci["process.env"]
    nodes = [(d["path"], d["major"], d["minor"]) for d in oci["linux.devices"]]
    rdev = [os.stat(n.host).st_rdev for n in edits.device_nodes]
    assert [
        (n.path, os.major(r), os.minor(r)) for n, r in zip(edits.device_nodes, rdev, strict=True)
    ] == nodes
    mounts = [(m["destination"], m["source"], m.get("options", [])) for m in oci["mounts"]]
    assert [(m.container_path, m.host_path, list(m.options)) for m in edits.mounts] == mounts


def test_edits_later_wins_and_mounts_sorted(tmp_path: Path, host: Path) -> None:
    cache = SpecCache(overlapping_dirs(tmp_path, host))
    edits = cache.edits_for(["acme.com/gpu=0", "acme.com/nic=n0"])
    assert edits.env == ("SHARED=nic", "A=1", "GPU=0")  # later value, first position
    assert [n.path for n in edits.device_nodes] == ["/dev/g0", "/dev/ctl"]  # moved to the end
    assert edits.device_nodes[1].host == f"{host}/dev/nic0"
    assert [m.container_path for m in edits.mounts] == [
        "/usr",
        "lib/nic.so",
        "/etc/conf",
        "/usr/lib/x/libcuda.so",
    ]
    assert next(m for m in edits.mounts if m.container_path == "/etc/conf").host_path.endswith(
        "conf2"
    )
    with pytest.raises(UnresolvedDevices, match=r"acme\.com/gpu=9") as info:
        cache.edits_for(["acme.com/gpu=0", "acme.com/gpu=9"])
    assert info.value.names == ("acme.com/gpu=9",)


def test_cache_reloads_on_change_only(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(spec("acme.com/gpu", device("0")))
    cache = SpecCache([tmp_path])
    first = cache.state()
    assert cache.state() is first and not cache.refresh()
    assert cache.device("acme.com/gpu=0") is not None
    (tmp_path / "b.yaml").write_text(spec("acme.com/gpu", device("0")))
    assert cache.device("acme.com/gpu=0") is None
    assert cache.conflicts == {"acme.com/gpu=0": (tmp_path / "a.yaml", tmp_path / "b.yaml")}
    (tmp_path / "b.yaml").write_text(spec("acme.com/gpu", device("1")))  # rewritten in place
    assert cache.names() == {"acme.com/gpu=0", "acme.com/gpu=1"}
    (tmp_path / "b.yaml").write_text("kind: [\n")
    assert list(cache.errors) == [tmp_path / "b.yaml"]
    assert "\n" not in cache.errors[tmp_path / "b.yaml"]
