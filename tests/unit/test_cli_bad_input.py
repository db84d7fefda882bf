"""Every subcommand with bad input: each file-taking argument gets a missing path, a directory,
an empty file, a binary, invalid UTF-8, a YAML list and scalar, a file over the size limit, a
symlink loop and a file of the wrong kind (plus a FIFO and /dev/zero, in a child with a memory
limit); value flags get empty, negative, huge, non-numeric, unicode and multi-line values.

Each must end in exit 2 and ONE line on stderr (argparse's usage line may come first), never a
traceback, a hang or a huge allocation. The checkers (``validate``, ``policy check``) list one
line per problem and a summary, exit 1; a file they cannot read is exit 2. Cases already pinned
elsewhere (test_hostile_input, test_fuzz_inputs, test_cli_*) are not repeated.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from cdigen.fileio import DEFAULT_MAX_INPUT_BYTES
from tests.helpers.cli import error_lines, run_main

REPO = Path(__file__).resolve().parents[2]
NODE = str(REPO / "cdigen" / "discover" / "data" / "dgx1-v100.yaml")
POLICY = str(REPO / "policies" / "builtin" / "pack.yaml")
CLAIM = str(REPO / "deploy" / "dra" / "examples" / "two-gpus-one-numa-node.yaml")
CLASSES = str(REPO / "deploy" / "dra" / "deviceclasses.yaml")
TOPO = str(REPO / "tests" / "fixtures" / "topologies" / "dgx-a100.txt")
A100 = "builtin:dgx-a100"
SPEC = (
    "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices:\n"
    "- name: x\n  containerEdits:\n    deviceNodes: [{path: /dev/x, permissions: rw}]\n"
)

BAD_FILES = ("missing", "dir", "empty", "binary", "badutf8", "list", "scalar", "huge", "loop")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The bad files, made once; ``T`` is a scratch directory for the servers' sockets."""
    d = tmp_path_factory.mktemp("bad")
    (d / "dir").mkdir()
    (d / "empty.yaml").write_text("")
    (d / "binary").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    (d / "badutf8.yaml").write_bytes(b"a: \xff\xfe\x80\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    (d / "scalar.yaml").write_text("42\n")
    with open(d / "huge.yaml", "wb") as f:  # sparse: only the reader's limit is read
        f.truncate(DEFAULT_MAX_INPUT_BYTES + 1024)
    os.symlink(d / "loopb", d / "loop")
    os.symlink(d / "loop", d / "loopb")
    (d / "spec.yaml").write_text(SPEC)
    (d / "T").mkdir()
    out = {k: str(d / k) for k in ("dir", "binary", "loop", "T")}
    out.update({k: str(d / f"{k}.yaml") for k in ("empty", "badutf8", "list", "scalar", "huge")})
    out.update(missing=str(d / "nope" / "x.yaml"), spec=str(d / "spec.yaml"))
    out.update(node=NODE, policy=POLICY, claim=CLAIM)
    return out


def fill(argv: list[str], files: dict[str, str], bad: str) -> list[str]:
    """``argv`` with ``{F}`` the bad file and ``{name}`` the scratch paths."""
    return [a.replace("{F}", bad).format(**files) if "{" in a else a for a in argv]


def assert_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, _, err = run_main(argv, capsys)
    lines = error_lines(err)
    assert "Traceback" not in err, err
    assert (code, len(lines)) == (2, 1), err
    assert ": error: " in lines[0], err
    return lines[0]


# --- file arguments ------------------------------------------------------------------------

# (label, argv with {F} for the file, wrong-kind file, the kinds to try)
FILE_ARGS: list[tuple[str, list[str], str, tuple[str, ...]]] = [
    ("discover --node", ["discover", "--node", "{F}"], "spec", BAD_FILES),
    ("topo --node", ["topo", "--node", "{F}"], "policy", ("missing", "list")),
    ("topo import", ["topo", "import", "{F}"], "node", BAD_FILES),
    ("generate --node", ["generate", "--node", "{F}", "--dry-run"], "policy", ("dir", "scalar")),
    (
        "dra explain --claim",
        ["dra", "explain", "--node", A100, "--claim", "{F}"],
        "spec",
        BAD_FILES,
    ),
    (
        "dra explain --class",
        ["dra", "explain", "--node", A100, "--claim", CLAIM, "--class", "{F}"],
        "policy",
        ("empty", "binary", "list", "huge"),
    ),
    ("dra explain --node", ["dra", "explain", "--node", "{F}", "--claim", CLAIM], "claim", ()),
    ("dra check", ["dra", "check", "{F}"], "node", BAD_FILES),
    (
        "dra serve --node",
        ["dra", "serve", "--node", "{F}", "--kubelet-dir", "{T}", "--node-name", "n"],
        "claim",
        ("empty",),
    ),
    (
        "dra serve --kubeconfig",
        [
            "dra",
            "serve",
            "--node",
            A100,
            "--kubelet-dir",
            "{T}",
            "--cdi-dir",
            "{T}",
            "--node-name",
            "n",
            "--kubeconfig",
            "{F}",
        ],
        "node",
        BAD_FILES,
    ),
    (
        "plugin serve --config",
        ["plugin", "serve", "--node", A100, "--plugin-dir", "{T}", "--config", "{F}"],
        "policy",
        tuple(k for k in BAD_FILES if k != "empty"),  # an empty config means the defaults
    ),
    (
        "plugin serve --node",
        ["plugin", "serve", "--node", "{F}", "--plugin-dir", "{T}"],
        "spec",
        ("binary",),
    ),
    (
        "policy explain --policy",
        [
            "policy",
            "explain",
            "--node",
            A100,
            "--policy",
            "{F}",
            "--available",
            "0,1,2",
            "--size",
            "2",
        ],
        "claim",
        BAD_FILES,
    ),
    (
        "policy explain --node",
        ["policy", "explain", "--node", "{F}", "--available", "0,1", "--size", "2"],
        "policy",
        ("loop",),
    ),
    (
        "policy replay --requests",
        ["policy", "replay", "--node", A100, "--requests", "{F}"],
        "node",
        tuple(k for k in BAD_FILES if k != "empty"),  # no requests: nothing to answer
    ),
    (
        "policy replay --policy",
        ["policy", "replay", "--node", A100, "--policy", "{F}", "--requests", "{empty}"],
        "spec",
        ("badutf8",),
    ),
    (
        "policy simulate --policy",
        ["policy", "simulate", "--node", A100, "--policy", "{F}", "--steps", "3"],
        "node",
        ("huge",),
    ),
    ("policy simulate --node", ["policy", "simulate", "--node", "{F}", "--steps", "3"], "spec", ()),
]
FILE_CASES = [
    pytest.param(argv, kind, id=f"{label} [{kind}]")
    for label, argv, wrong, kinds in FILE_ARGS
    for kind in (*kinds, f"wrong:{wrong}")
]


@pytest.mark.parametrize(("argv", "kind"), FILE_CASES)
def test_a_bad_file_is_one_line_and_exit_2(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], kind: str
) -> None:
    bad = scratch[kind.removeprefix("wrong:")]
    line = assert_one_line_exit_2(fill(argv, scratch, bad), capsys)
    assert bad in line or "--class" in line, line  # the error names the file (or the flag)


UNREADABLE = ("missing", "dir", "binary", "badutf8", "huge", "loop")  # read_text refuses them


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        (command, kind)
        for command in (["validate"], ["policy", "check"])
        for kind in BAD_FILES
        if kind not in UNREADABLE
    ],
)
def test_the_checkers_list_a_bad_file_as_a_problem_exit_1(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str], command: list[str], kind: str
) -> None:
    """validate and policy check report a file they can read but not use as one problem of
    the check; one they cannot read is bad input (exit 2, as for every other subcommand)."""
    code, out, err = run_main([*command, scratch[kind]], capsys)
    lines = err.splitlines()
    assert (code, out, len(lines)) == (1, "", 2), err
    assert lines[0].startswith(f"{scratch[kind]}: ") and lines[1].startswith("cdigen: ")


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        (c, k)
        for c in (["validate"], ["policy", "check"])
        for k in UNREADABLE
        if (c, k) != (["validate"], "dir")
    ],
)
def test_the_checkers_refuse_a_file_they_cannot_read_exit_2(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str], command: list[str], kind: str
) -> None:
    line = assert_one_line_exit_2([*command, scratch[kind]], capsys)
    assert scratch[kind] in line, line


def test_validate_an_empty_dir_is_one_line(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a note that the dir has no specs, then an error that there is nothing to check."""
    line = assert_one_line_exit_2(["validate", scratch["dir"], f"{scratch['T']}/*.json"], capsys)
    assert line == (
        f"cdigen: error: no CDI spec files (*.yaml, *.json) in {scratch['dir']}; no files match "
        f"{scratch['T']}/*.json; name CDI spec files, or directories that hold *.yaml or *.json "
        "specs"
    )


def test_dra_check_refuses_a_file_with_nothing_to_check(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 0 and '1 file(s) OK' for an empty file or a node file."""
    line = assert_one_line_exit_2(["dra", "check", CLAIM, NODE], capsys)
    assert line == (
        f"cdigen: error: {NODE}: no ResourceClaim, ResourceClaimTemplate or DeviceClass in it "
        "(found Node); give the claim or DeviceClass manifests"
    )


# --- FIFO and /dev/zero, in a child: a blocked open or an endless read must not take the run --

CHILD = """
import json, sys
from cdigen.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    results.append(code)
print(json.dumps(results))
"""


def _limited() -> None:  # in the child: 1 GiB of address space
    resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_no_file_argument_blocks_on_a_fifo_or_reads_dev_zero(
    scratch: dict[str, str], tmp_path: Path, what: str
) -> None:
    path = what
    if what == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # nobody writes
    argvs = [fill(argv, scratch, path) for _, argv, _, _ in FILE_ARGS]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
        cwd=REPO,
    )
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    codes = json.loads(done.stdout.splitlines()[-1])
    assert dict(zip([label for label, *_ in FILE_ARGS], codes, strict=True)) == {
        label: 2 for label, *_ in FILE_ARGS
    }
    kind = "a pipe" if what == "fifo" else "a character device"
    assert done.stderr.count(f"{path}: expected a") >= len(FILE_ARGS) - 1, done.stderr
    assert f"found {kind}" in done.stderr


# --- value flags -----------------------------------------------------------------------------

SERVE_DRA = ["dra", "serve", "--node", A100, "--kubelet-dir", "{T}", "--cdi-dir", "{T}"]
SERVE_PLUGIN = ["plugin", "serve", "--node", A100, "--plugin-dir", "{T}"]
EXPLAIN = ["policy", "explain", "--node", A100, "--available", "0,1,2", "--size", "2"]
SIMULATE = ["policy", "simulate", "--node", A100, "--steps", "3"]
DRA_EXPLAIN = ["dra", "explain", "--node", A100, "--claim", CLAIM, "--class", CLASSES]
GENERATE = ["generate", "--node", A100, "--dry-run"]
HUGE = "9" * 30

# (argv, text the one error line must hold); the first of each group was a bug before.
VALUE_CASES = [
    # a huge count ran for minutes (policy explain, simulate) instead of a one-line error
    (
        [
            "policy",
            "explain",
            "--node",
            A100,
            "--available",
            "0",
            "--size",
            "1",
            "--replicas",
            HUGE,
        ],
        "--replicas must be at most 1024",
    ),
    ([*SIMULATE, "--replicas", HUGE], "--replicas must be at most 1024"),
    ([*SIMULATE[:-1], HUGE], "--steps must be at most 100000"),
    ([*SIMULATE[:-1], "0"], "--steps must be at least 1"),
    ([*SIMULATE, "--slice-mib", "-1"], "--slice-mib must be at least 1"),
    ([*EXPLAIN, "--alternatives", "-1"], "--alternatives must be at least 0"),
    ([*EXPLAIN, "--size", "nan"], "argument --size: invalid int value: 'nan'"),
    ([*EXPLAIN[:-1], "-1"], "--size must be at least 1, got -1"),
    ([*EXPLAIN, "--must", "a\nb"], "must-include devices a b are not among the available"),
    ([*EXPLAIN[:5], "ünï☃", *EXPLAIN[6:]], "unknown device IDs ünï☃"),
    # an empty --memory-step / --capability-devices was taken as "not given"
    ([*DRA_EXPLAIN, "--memory-step", ""], "--memory-step: '' is not a positive whole quantity"),
    ([*SERVE_DRA, "--node-name", "n", "--memory-step", ""], "--memory-step: ''"),
    (
        [*SERVE_DRA, "--node-name", "n", "--capability-devices", ""],
        "--capability-devices: unknown driver capability ''",
    ),
    ([*SERVE_DRA, "--node-name", "n", "--memory-step", "-1"], "--memory-step: '-1'"),
    ([*SERVE_DRA, "--node-name", "n", "--replicas", HUGE], f"--replicas: {HUGE} is not in 1-1024"),
    ([*SERVE_DRA, "--node-name", "n", "--mps-thread-percentage", "0"], "is not a percentage"),
    ([*SERVE_DRA, "--node-name", "n", "--taint-xid", "79=Sometimes"], "is not XID=EFFECT"),
    # driver and node names went unchecked into sockets, slices and attributes
    ([*SERVE_DRA, "--node-name", "a\nb"], "--node-name: 'a\\nb' is not a DNS subdomain"),
    ([*SERVE_DRA, "--node-name", "Node_1"], "--node-name: 'Node_1' is not a DNS subdomain"),
    ([*SERVE_DRA, "--node-name", "n", "--driver-name", ""], "--driver-name: '' is not a DNS"),
    ([*SERVE_DRA, "--node-name", "n", "--driver-name", "x" * 64], "of at most 63 characters"),
    ([*DRA_EXPLAIN, "--driver-name", "ünï☃"], "--driver-name: 'ünï☃' is not a DNS subdomain"),
    (["dra", "check", CLAIM, "--driver-name", "gpu.example.com\n"], "is not a DNS subdomain"),
    ([*SERVE_DRA, "--node-name", ""], "--node-name: no node name"),
    # an empty path was the current directory
    ([*SERVE_PLUGIN, "--policy-dir", ""], "--policy-dir: the path is empty"),
    ([*SERVE_PLUGIN[:-1], ""], "--plugin-dir: the path is empty"),
    ([*SERVE_PLUGIN, "--spec-dir", "{T}", "--spec-dir", ""], "--spec-dir: the path is empty"),
    (["list", "--spec-dir", ""], "--spec-dir: the path is empty"),
    ([*GENERATE, "--host-root", ""], "--host-root: the path is empty"),
    ([*GENERATE, "--dev-root", ""], "--dev-root: '' is not an absolute path"),
    ([*SERVE_PLUGIN, "--health-poll-interval", "nan"], "expected seconds in (0, 3600], got nan"),
    ([*SERVE_PLUGIN, "--health-poll-interval", HUGE], "expected seconds in (0, 3600]"),
    ([*SERVE_PLUGIN, "--resource", "a\nb"], "resource name 'a\\nb' has no domain"),
    ([*SERVE_PLUGIN, "--cdi-kind", ""], "invalid kind ''"),
    ([*SERVE_PLUGIN, "--metrics-address", "ünï☃"], "metrics address 'ünï☃' is not HOST:PORT"),
    # generate: a bad --cdi-version came after discovery's warning (two lines)
    ([*GENERATE, "--cdi-version", "a\nb"], "--cdi-version: unknown cdiVersion 'a\\nb'"),
    ([*GENERATE, "--cdi-version", "-1"], "--cdi-version: unknown cdiVersion '-1'"),
    ([*GENERATE, "--vendor", ""], "vendor"),
    ([*GENERATE, "--device-name-strategy", "a\nb"], "unknown device name strategy 'a\\nb'"),
    ([*GENERATE, "--capabilities", HUGE], f"unknown driver capability '{HUGE}'"),
    ([*GENERATE, "--hook-path", "ünï☃"], "'ünï☃' is not an absolute path"),
    # topo import wrote node files that did not load again
    (
        ["topo", "import", TOPO, "--cuda-driver-version", "ünï☃"],
        "the imported node would not load: cudaDriverVersion: 'ünï☃' does not match",
    ),
    (["topo", "import", TOPO, "--memory", "-1"], "--memory"),
    (["topo", "import", TOPO, "--memory", "ünï☃"], "--memory"),
    (["discover", "--node", "a\nb"], "a\nb"[:1]),
]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(a, e, id=" ".join(a).replace(f"{REPO}/", "")[:90].replace("\n", "\\n"))
        for a, e in VALUE_CASES
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    line = assert_one_line_exit_2(fill(argv, scratch, ""), capsys)
    assert expected in line, line


def test_plugin_dir_that_is_a_file_is_the_only_output(
    scratch: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # ~17 start-up log lines (missing specs, unhealthy devices) came before the error line
    code, _, err = run_main([*SERVE_PLUGIN[:-1], scratch["spec"]], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("cdigen: error: "), err
    assert f"{scratch['spec']}: cannot create the plugin directory: not a directory" in err


def test_topo_import_output_always_loads_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Values the node schema takes (any name, a newline in it) round-trip through the file."""
    out = tmp_path / "node.yaml"
    code, _, _ = run_main(["topo", "import", TOPO, "--name", "a\nb", "--gpu-name", "", "-o",
                           str(out)], capsys)  # fmt: skip
    assert code == 0
    code, text, err = run_main(["discover", "--node", str(out), "--format", "json"], capsys)
    assert (code, err) == (0, "") and json.loads(text)["name"] == "a\nb"
