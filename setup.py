"""The one build step pyproject.toml cannot say: ship the top-level data folders in the wheel.

``devices/`` (device specs and link presets) and ``profiles/`` (published and reference
profiles) stay at the top of the source tree, where DESIGN.md puts them and where people edit
them. The wheel carries a copy as ``edgesplit/_data/<folder>/``; ``edgesplit.util.shipped_dir``
finds the copy in an installed package and the top-level folder in a checkout. Everything else
is declared in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("devices", "profiles")  # the same as edgesplit.util.SHIPPED


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the top-level folders in place
        root = Path(__file__).resolve().parent
        for name in SHIPPED:
            for src in sorted((root / name).rglob("*")):
                if src.is_file():
                    dest = Path(
                        self.build_lib, "edgesplit", "_data", name, src.relative_to(root / name)
                    )
                    self.mkpath(str(dest.parent))
                    self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithData})
