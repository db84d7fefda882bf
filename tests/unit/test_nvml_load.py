"""NVML's library from the driver root: where it is looked for, in which order, and what the
error says when none loads (issue 11, point 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest

from cdigen.cdi.hostfs import HostFS
from cdigen.cli import main
from cdigen.discover.nvml_library import (
    nvml_library_paths,
    preload_nvml_library,
    start_nvml,
)
from cdigen.errors import DiscoveryError
from tests.cdihost import write_ld_cache

CACHE_DIR = "/opt/nvidia/lib64"  # known to the root's loader only through its ld.so.cache
STD_DIR = "/usr/lib/x86_64-linux-gnu"


class Module:
    """pynvml's library slot and lock, and an nvmlInit that fails as pynvml's would."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND

    def __init__(self) -> None:
        self.nvmlLib: Any = None
        self.libLoadLock = threading.Lock()

    def nvmlInit(self) -> None:
        if self.nvmlLib is None:  # the by-name load of pynvml, on a machine without a driver
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def driver_root(base: Path) -> Path:
    """A driver root with libnvidia-ml.so.1 in a standard dir and in one named by ld.so.cache."""
    for d in (CACHE_DIR, STD_DIR):
        lib = base / d.lstrip("/") / "libnvidia-ml.so.550.54.15"
        lib.parent.mkdir(parents=True)
        lib.write_text("not an ELF file\n")
        os.symlink(lib.name, lib.parent / "libnvidia-ml.so.1")
    write_ld_cache(
        base / "etc/ld.so.cache", [("libnvidia-ml.so.1", f"{CACHE_DIR}/libnvidia-ml.so.1")]
    )
    return base


def test_the_roots_cache_entry_is_tried_first_then_the_usual_dirs(tmp_path: Path) -> None:
    root = driver_root(tmp_path / "driver")
    tried: list[str] = []

    def cdll(path: str) -> object:
        tried.append(path)
        raise OSError(f"{path}: invalid ELF header")

    attempts = preload_nvml_library(Module(), str(root), cdll=cdll)
    assert tried == [
        f"{root}{CACHE_DIR}/libnvidia-ml.so.1",
        f"{root}{STD_DIR}/libnvidia-ml.so.1",
    ]
    assert attempts is not None
    assert [(a.path, a.error) for a in attempts] == [
        (tried[0], "invalid ELF header"),
        (tried[1], "invalid ELF header"),
        (f"{root}/usr/lib/libnvidia-ml.so.1", "no such file"),  # not there: not opened
    ]


def test_the_first_library_that_loads_is_pynvmls_library(tmp_path: Path) -> None:
    root = driver_root(tmp_path / "driver")
    module, library = Module(), object()
    attempts = preload_nvml_library(module, str(root), cdll=lambda path: library)
    assert module.nvmlLib is library
    assert attempts is not None and [a.path for a in attempts] == [
        f"{root}{CACHE_DIR}/libnvidia-ml.so.1"
    ]
    start_nvml(module, driver_root=str(root), cdll=lambda path: pytest.fail("loaded twice"))


def test_under_a_host_root_links_resolve_inside_it(tmp_path: Path) -> None:
    host = tmp_path / "host"
    root = driver_root(host / "run/nvidia/driver")
    os.symlink("/run/nvidia/driver/usr", host / "usr")  # absolute: only right inside the root
    paths = nvml_library_paths("/run/nvidia/driver", HostFS(str(host)))
    assert paths[0] == f"{root}{CACHE_DIR}/libnvidia-ml.so.550.54.15"
    assert paths[1] == f"{root}{STD_DIR}/libnvidia-ml.so.550.54.15"


def test_the_error_names_every_path_tried_and_fits_the_case(tmp_path: Path) -> None:
    root = driver_root(tmp_path / "driver")
    with pytest.raises(DiscoveryError) as err:
        start_nvml(Module(), driver_root=str(root), cdll=_refuse)
    message = str(err.value)
    assert f"{root}{CACHE_DIR}/libnvidia-ml.so.1: invalid ELF header" in message
    assert f"{root}{STD_DIR}/libnvidia-ml.so.1: invalid ELF header" in message
    assert "not found by name by the dynamic loader" in message
    assert "not a library this process can load" in message

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DiscoveryError) as err:
        start_nvml(Module(), driver_root=str(empty), cdll=_refuse)
    assert f"--driver-root {empty} holds no NVIDIA driver" in str(err.value)
    assert "builtin:" not in str(err.value)  # the advice for a machine without a GPU is wrong here


def test_a_containerized_driver_is_pointed_out(tmp_path: Path) -> None:
    host = tmp_path / "host"
    driver_root(host / "run/nvidia/driver")
    (host / "usr/lib").mkdir(parents=True)
    with pytest.raises(DiscoveryError) as err:
        start_nvml(Module(), host_root=str(host), cdll=_refuse)
    message = str(err.value)
    assert f"not in {host}/usr/lib;" in message
    assert "the driver is containerized: add --driver-root /run/nvidia/driver" in message


def _refuse(path: str) -> object:
    raise OSError(f"{path}: invalid ELF header")


def _real_driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()  # pragma: no cover - only on a machine with a GPU driver
    return True  # pragma: no cover


def test_cli_tries_the_fake_library_under_driver_root_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if _real_driver_present():  # pragma: no cover - the loader would then find the real one
        pytest.skip("this machine has an NVIDIA driver: NVML loads by name after the fake")
    root = driver_root(tmp_path / "driver")
    assert main(["discover", "--driver-root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("cdigen: error: NVML library not found (libnvidia-ml.so.1): ")
    first = err.index(f"{root}{CACHE_DIR}/libnvidia-ml.so.1: ")
    assert first < err.index(f"{root}{STD_DIR}/libnvidia-ml.so.1: ")
    assert first < err.index("by name")


FAKE_NVML_C = """
int nvmlInitWithFlags(unsigned int flags) { return 9; } /* NVML_ERROR_DRIVER_NOT_LOADED */
int nvmlInit_v2(void) { return 9; }
"""


def test_a_real_library_under_driver_root_is_the_one_pynvml_uses(tmp_path: Path) -> None:
    """A shared object that answers nvmlInit with "driver not loaded", built here: the real
    pynvml calls into it, so it was loaded from the root and not by name."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build a stand-in libnvidia-ml.so.1")
    lib_dir = tmp_path / "driver" / STD_DIR.lstrip("/")
    lib_dir.mkdir(parents=True)
    source = tmp_path / "nvml.c"
    source.write_text(FAKE_NVML_C)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(lib_dir / "libnvidia-ml.so.1"), str(source)], check=True
    )
    # a fresh process: pynvml keeps the library it loaded for the life of the process
    run = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "discover", "--driver-root", str(tmp_path / "driver")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "the NVIDIA kernel driver is not loaded" in run.stderr
    assert f"(NVML from {lib_dir}/libnvidia-ml.so.1)" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_plugin_serve_loads_nvml_from_its_driver_root(tmp_path: Path) -> None:
    from cdigen.plugin.deviceplugin.runner import open_nvml

    if _real_driver_present():  # pragma: no cover - the loader would then find the real one
        pytest.skip("this machine has an NVIDIA driver: NVML loads by name after the fake")
    root = driver_root(tmp_path / "driver")
    assert open_nvml("builtin:rtx4090", str(root)) is None  # simulated: NVML is not touched
    with pytest.raises(DiscoveryError) as err:
        open_nvml("nvml", str(root))
    assert f"{root}{CACHE_DIR}/libnvidia-ml.so.1: " in str(err.value)
