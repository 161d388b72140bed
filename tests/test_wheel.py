"""The package as a user gets it: build the wheel, install it into a fresh venv, run it elsewhere.

The wheel is built from a copy of the source tree (so the checkout gets no ``build/`` folder),
without build isolation (offline: the test extra pins setuptools). The fresh venv has only
edgesplit from the wheel; its dependencies come from this test venv through a ``.pth`` file with
plain path lines, appended after the venv's own site-packages. Path lines do not run the test
venv's own ``.pth`` files, so the editable install of this checkout stays out of reach. Every
command runs from a folder outside the checkout, with no ``PYTHONPATH`` or ``EDGESPLIT_DEVICES``:
a spec that was not packaged is not found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

# top-level entries the build does not need
_SKIP = {
    ".git",
    ".venv",
    "out",
    "build",
    "apps",
    "tests",
    "benchmarks",
    ".hypothesis",
    ".ruff_cache",
}


def _ignore(folder: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    return skip | (_SKIP & set(names) if Path(folder) == REPO else set())


class Installed:
    """A venv holding edgesplit from the wheel, and a working folder outside the checkout."""

    def __init__(self, root: Path):
        src = root / "src"
        shutil.copytree(REPO, src, ignore=_ignore)
        wheels = root / "wheels"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)]
        subprocess.run(build, check=True, capture_output=True, timeout=300)
        (self.wheel,) = wheels.glob("edgesplit-*.whl")
        self.venv = root / "venv"
        venv.create(self.venv, with_pip=False)
        self.python = self.venv / "bin" / "python"
        install = [
            *pip,
            "--python",
            str(self.python),
            "install",
            "--no-deps",
            "--no-index",
            str(self.wheel),
        ]
        subprocess.run(install, check=True, capture_output=True, timeout=300)
        # only now the dependencies: pip never sees the test venv's own edgesplit from the new venv
        site = Path(self._ask("import sysconfig; print(sysconfig.get_paths()['purelib'])"))
        ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        (site / "zz-test-venv-dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
        self.work = root / "work"
        self.work.mkdir()

    def env(self) -> dict[str, str]:
        drop = {
            "PYTHONPATH",
            "EDGESPLIT_DEVICES",
            "EDGESPLIT_PROFILES_DIR",
            "EDGESPLIT_DEBUG",
            "VIRTUAL_ENV",
            "PYTHONHOME",
        }
        return {k: v for k, v in os.environ.items() if k not in drop} | {"PYTHONNOUSERSITE": "1"}

    def _ask(self, code: str) -> str:
        r = subprocess.run(
            [str(self.python), "-c", code],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd="/",
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        exe = self.venv / "bin" / "edgesplit"
        r = subprocess.run(
            [str(exe), *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.work,
            timeout=600,
        )
        assert r.returncode == 0, f"edgesplit {' '.join(args)}: {r.stderr[-3000:]}"
        return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("wheel"))


def test_the_package_comes_from_the_wheel_with_its_data(installed):
    code = (
        "import edgesplit, json; from edgesplit.device.spec import load_device, load_links; "
        "from edgesplit.profile.published import data_dir, load_fits, load_published; "
        "print(json.dumps([edgesplit.__file__, str(load_device('snapdragon-8gen2').path), "
        "sorted(load_links()), str(data_dir()), load_fits('snapdragon-8gen2') is not None, "
        "len(load_published('snapdragon-8gen2').figures)]));"
        "from edgesplit.backends.tvm.database import shipped_root; print(shipped_root())"
    )
    import json

    answer, tuning_root = installed._ask(code).splitlines()
    init, spec, links, profiles, calibrated, n_published = json.loads(answer)
    package = Path(init).parent
    assert package.is_relative_to(installed.venv) and not package.is_relative_to(REPO)
    assert Path(spec) == package / "_data" / "devices" / "snapdragon-8gen2.yaml"
    assert {"wifi", "lte", "5g"} <= set(links)
    assert (
        Path(profiles) == package / "_data" / "profiles"
        and (Path(profiles) / "README.md").is_file()
    )
    assert calibrated and n_published > 0  # the predictor's calibration travels with the package
    # the tuning databases too (profiles/tvm/NAME/: MetaSchedule's files and their target.json)
    assert Path(tuning_root) == package / "_data" / "profiles" / "tvm"
    shipped = {p.parent.name for p in (REPO / "profiles" / "tvm").glob("*/target.json")}
    assert shipped and {p.parent.name for p in Path(tuning_root).glob("*/target.json")} == shipped
    for name in shipped:
        assert (Path(tuning_root) / name / "database_tuning_record.json").is_file()
    assert (package / "py.typed").is_file()


def test_version_is_pyproject_s(installed):
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert installed.cli("--version").stdout.strip() == f"edgesplit {version}"
    assert installed._ask("import edgesplit; print(edgesplit.__version__)") == version


def test_devices_zoo_partition_profile_deploy_and_run_outside_the_checkout(installed):
    listed = installed.cli("devices").stdout
    for name in (
        "host",
        "host-biglittle",
        "snapdragon-8gen2",
        "raspberry-pi5",
        "server-a100",
        "links",
    ):
        assert name in listed, listed
    shown = installed.cli("devices", "show", "snapdragon-8gen2").stdout
    assert "_data/devices/snapdragon-8gen2.yaml" in "".join(
        shown.split()
    )  # the title, maybe wrapped
    assert "tiny_dag" in installed.cli("zoo", "--list").stdout
    installed.cli("zoo", "tiny_dag", "-o", "tiny.onnx")
    installed.cli(
        "partition",
        "tiny.onnx",
        "--device",
        "snapdragon-8gen2",
        "--server",
        "server-a100",
        "--link",
        "wifi",
        "-o",
        "plan.json",
    )
    assert (installed.work / "plan.json").is_file()
    installed.cli(
        "profile",
        "tiny.onnx",
        "--backend",
        "ort",
        "--runs",
        "2",
        "--warmup",
        "1",
        "-q",
        "-o",
        "p.json",
    )
    installed.cli(
        "deploy",
        "tiny.onnx",
        "--device",
        "host",
        "--profile",
        "p.json",
        "--runs",
        "2",
        "-o",
        "bundle",
    )
    assert (installed.work / "bundle" / "manifest.json").is_file()
    installed.cli("run", "bundle", "--repeat", "3")
