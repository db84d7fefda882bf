"""The spec cache against the CDI library itself, as podman vendors it (helpers/cdi_runtime.py).

``cdigen list`` and podman must agree on the files that load, the devices that resolve (and from
which file) and the conflicts; ``SpecCache.edits_for`` and what a container given the same names
gets: env, device nodes, mounts (source, read-only, and a mount under another one visible).
podman cannot show the order of env or of mounts of equal depth; ``test_edits_later_wins_and_
mounts_sorted`` checks those in ``edits_for`` itself. Debian 12's podman 4.3 vendors CDI library
0.5.x: where that older library loads a file differently from v1.1.0 (which cdigen models), the
case is named in :data:`OLDER_LIBRARY` with the reason.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdigen.cdi.cache import SpecCache, UnresolvedDevices, load_state
from cdigen.cdi.validate import spec_problems
from cdigen.cli import main
from cdigen.fileio import parse_document
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


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


def marked(name: str) -> str:
    """Spec-wide edits that tell, inside a container, which file a device came from."""
    return f"containerEdits:\n  env: [SPEC={name}]\n"


@pytest.fixture
def messy(tmp_path: Path) -> list[Path]:
    """Two dirs with a conflict, broken files, a lint-rejected file, overlaps and ignored files."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "a.yaml").write_text(
        spec("acme.com/gpu", device("0") + device("1") + device("both"), marked("a.yaml"))
    )
    (etc / "b.yaml").write_text(
        spec("acme.com/gpu", device("both") + device("b1"), marked("b.yaml"))
    )
    (run / "c.yaml").write_text(  # run wins
        spec("acme.com/gpu", device("both") + device("1"), marked("c.yaml"))
    )
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


def in_container(path: str, dirs: list[Path]) -> str:
    """Where podman's library sees a spec file of ``dirs`` (bound over /etc/cdi, /var/run/cdi)."""
    for folder, seen in zip(dirs, ("/etc/cdi", "/var/run/cdi"), strict=False):
        if Path(path).parent == folder:
            return f"{seen}/{Path(path).name}"
    raise AssertionError(f"{path} is in none of {dirs}")


def test_list_agrees_with_the_cdi_library(
    messy: list[Path], capsys: pytest.CaptureFixture[str], podman: CdiRuntime
) -> None:
    """Each device ``cdigen list`` lists resolves in podman, from the file it names (runc then
    refuses the relative mount of acme.com/tpu=t0, after the library resolved it); every other
    name the files define does not resolve; the library's load errors name the same conflict
    and the same failed files (``env.json``'s error names its device, not its file)."""
    etc, run = messy
    assert spec_problems(parse_document(RELATIVE, where="RELATIVE"))  # the lint rejects it
    failed, devices, conflicts = cdigen_view(messy, capsys)
    assert failed == {str(etc / n) for n in ("broken.yaml", "env.json", "unknown.yaml")}
    assert devices["acme.com/tpu=t0"] == str(etc / "relative.yaml")
    assert devices["acme.com/gpu=1"] == str(run / "c.yaml")
    assert conflicts == {"acme.com/gpu=both": {str(etc / "a.yaml"), str(etc / "b.yaml")}}
    for name, path in devices.items():
        seen = podman.run(etc, [name], var_run_cdi=run)
        if seen.ok:
            assert seen.env["SPEC"] == Path(path).name, name
        else:
            assert not seen.unresolvable() and "lib/x" in seen.error, (name, seen.error)
    defined = {"acme.com/gpu=both", "acme.com/xx=e", "acme.com/yy=u", "acme.com/zz=z"}
    for name in sorted(defined):
        seen = podman.run(etc, [name], var_run_cdi=run, debug=True)
        assert seen.unresolvable(), (name, seen.error)
    errors = seen.load_errors
    pair = {in_container(p, messy) for p in conflicts["acme.com/gpu=both"]}
    assert [e for e in errors if e.startswith("conflicting device")] == [
        'conflicting device "acme.com/gpu=both" (specs "{}", "{}")'.format(*sorted(pair)[::-1])
    ]
    load = [e for e in errors if e.startswith("failed to load CDI Spec")]
    assert len(load) == len(failed)
    named = {m for e in load for m in re.findall(r'CDI Spec "([^"]+)"', e)}
    assert named == {in_container(p, messy) for p in failed if not p.endswith(".json")}
    assert any('device "e"' in e and "NOEQUALS" in e for e in load)


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


# Where podman 4.3's CDI library (0.5.x) loads a case differently from v1.1.0, which cdigen models.
OLDER_LIBRARY = {
    "annotation-number": "cdiVersion 0.6.0 is past 0.5.x, which knows no 'annotations'",
    "too-low-version": "0.5.x has no minimum version for a node's hostPath",
    "no-devices": "0.5.x loads a spec without devices (it contributes nothing either way)",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_loads(tmp_path: Path, case: str, podman: CdiRuntime) -> None:
    """cdigen's verdict, and podman's library on the same file: it loads (no load error, its
    devices resolve) or not, but for the cases :data:`OLDER_LIBRARY` names."""
    text, loads = CASES[case]
    (tmp_path / "spec.yaml").write_text(text)
    state = load_state([tmp_path])
    assert bool(state.devices) is loads and bool(state.errors) is not loads, state.errors
    names = sorted(state.devices) or ["acme.com/gpu=a"]
    if loads:  # resolved (a node without hostPath may then fail to stat "x": after resolving)
        seen = podman.run(tmp_path, names)
        assert not seen.unresolvable() or case in OLDER_LIBRARY, seen.error
    else:  # refused before any container starts: the debug log names the load error
        seen = podman.run(tmp_path, names, debug=True)
        refused = seen.unresolvable() and bool(seen.load_errors)
        assert refused or case in OLDER_LIBRARY, seen.error


# --- injection ---------------------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Real device nodes and mount sources (files holding their names, a dir) for podman."""
    base = tmp_path / "host"
    for minor, name in enumerate(("ctl", "gpu0", "gpu1", "nic0")):
        (base / "dev").mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(base / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        except PermissionError:
            pytest.skip("mknod is not permitted here: the CDI library stats device nodes")
    for name in ("libcuda.so", "libnic.so", "conf", "conf2"):
        (base / name).write_text(name)
    (base / "dir").mkdir()
    (base / "dir" / "marker").write_text("dir")
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
        f"    mounts: [{mount('conf2', '/etc/conf', 'bind')}]\n"
    )
    nic_spec = f"containerEdits:\n  mounts:\n  - {mount('libnic.so', '/lib/nic.so', 'rbind')}\n"
    (run / "nic.yaml").write_text(spec("acme.com/nic", device("n0", nic0), nic_spec))
    return [etc, run]


REQUESTS = [
    ["acme.com/gpu=0"],
    ["acme.com/gpu=1", "acme.com/gpu=0"],
    ["acme.com/gpu=0", "acme.com/nic=n0"],
    ["acme.com/nic=n0", "acme.com/gpu=1", "acme.com/gpu=0"],
]


@pytest.mark.parametrize("names", REQUESTS, ids=lambda n: "+".join(n))
def test_edits_agree_with_injection(
    tmp_path: Path, host: Path, names: list[str], podman: CdiRuntime
) -> None:
    """A container given ``names`` has the env, device nodes (major, minor) and mounts of
    ``edits_for``: each mount's source (the text of the host file) and read-only option, and
    ``/usr/lib/x/libcuda.so`` visible inside the ``/usr`` mount (mounted after it)."""
    etc, run = overlapping_dirs(tmp_path, host)
    edits = SpecCache([etc, run]).edits_for(names)
    mounts = {m.container_path: m for m in edits.mounts}
    seen = podman.run(etc, names, var_run_cdi=run, read=[*mounts, "/usr/marker"])
    assert seen.ok, seen.error
    keys = {"GPU", "SHARED", "A", "X"}
    assert dict(e.split("=", 1) for e in edits.env) == {
        k: v for k, v in seen.env.items() if k in keys
    }
    rdev = {n.path: os.stat(n.host).st_rdev for n in edits.device_nodes}
    ours = {"/dev/g0", "/dev/g1", "/dev/ctl"}
    assert {p: (os.major(r), os.minor(r)) for p, r in rdev.items()} == {
        p: n for p, n in seen.nodes.items() if p in ours
    }
    for path, mount in mounts.items():
        source = Path(mount.host_path)
        text = (source / "marker" if source.is_dir() else source).read_text()
        shown = seen.files["/usr/marker" if source.is_dir() else path].strip()
        assert shown == text, (path, seen.files)
        assert ("ro" in mount.options) is ("ro" in seen.mounts[path]), (path, seen.mounts[path])


def test_edits_later_wins_and_mounts_sorted(tmp_path: Path, host: Path) -> None:
    cache = SpecCache(overlapping_dirs(tmp_path, host))
    edits = cache.edits_for(["acme.com/gpu=0", "acme.com/nic=n0"])
    assert edits.env == ("SHARED=nic", "A=1", "GPU=0")  # later value, first position
    assert [n.path for n in edits.device_nodes] == ["/dev/g0", "/dev/ctl"]  # moved to the end
    assert edits.device_nodes[1].host == f"{host}/dev/nic0"
    assert [m.container_path for m in edits.mounts] == [
        "/usr",
        "/lib/nic.so",
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
