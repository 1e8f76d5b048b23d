"""Package discovery for the wheel; the rest of the metadata lives in pyproject.toml.

The repository root is itself the package (ComfyUI loads it from custom_nodes/), installed as ``comfyui_fastar``.
pyproject.toml cannot put a prefix on discovered packages, so they are found here: every folder with an
``__init__.py`` ships as ``comfyui_fastar.<folder>``, and a new subpackage is never left out of the wheel.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Leaves this file out: it sits in the package's folder (the root) but is no module of the package."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "comfyui_fastar" and m[1] == "setup")]


subpackages = find_packages(exclude=["tests", "tests.*"])
setup(packages=["comfyui_fastar", *(f"comfyui_fastar.{name}" for name in subpackages)], cmdclass={"build_py": BuildPy})
