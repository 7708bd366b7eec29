"""Maps the repository's top-level folders (agent/, collector/, api/, ...) onto one import
namespace (gpufleet.agent, gpufleet.collector, ...). Everything else is in pyproject.toml."""

import os
from pathlib import Path

from setuptools import Extension, setup

ROOTS = {
    "gpufleet": "gpufleet",
    "gpufleet.agent": "agent",
    "gpufleet.collector": "collector",
    "gpufleet.storage": "storage",
    "gpufleet.analysis": "analysis",
    "gpufleet.alerts": "alerts",
    "gpufleet.api": "api",
    "gpufleet.migrations": "migrations",
}
# Folders of data only (no __init__.py): listed as packages of their own, with every subfolder,
# so the package-data patterns in pyproject.toml apply inside them. Without this the wheel held
# no JS, CSS or SVG and `serve` answered 500 on /static/app.css (scripts/smoke_wheel.sh checks).
DATA_ROOTS = {"gpufleet.api.static": "api/static",
              "gpufleet.dashboards": "dashboards/json"}  # what `gpufleet grafana push` uploads


def _packages() -> tuple[list[str], dict[str, str]]:
    here = Path(__file__).parent
    packages, dirs = [], {}
    for pkg, folder in ROOTS.items():
        for init in sorted((here / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(here / folder)
            name = ".".join([pkg, *rel.parts]) if rel.parts else pkg
            packages.append(name)
            dirs[name] = str(init.parent.relative_to(here))
    for pkg, folder in DATA_ROOTS.items():
        for d in sorted(p for p in [here / folder, *(here / folder).rglob("*")] if p.is_dir()):
            if d.name == "__pycache__":
                continue
            rel = d.relative_to(here / folder)
            name = ".".join([pkg, *rel.parts])
            packages.append(name)
            dirs[name] = str(d.relative_to(here))
    return packages, dirs


packages, package_dir = _packages()
# GPUFLEET_REQUIRE_C_EXTENSIONS=1 makes a failed compile fail the build: the Docker image sets
# it, so an image never ships the slow paths by accident (a missing compiler only warns).
optional = os.environ.get("GPUFLEET_REQUIRE_C_EXTENSIONS", "").strip() not in ("1", "true", "yes")
# The export encoder's C pass (collector/export/_encode_c.c): optional, so a box without a C
# compiler installs and runs on encode.py's numpy path (byte-identical bodies, more CPU).
encode_c = Extension("gpufleet.collector.export._encode_c", ["collector/export/_encode_c.c"], optional=optional)
# The remote-write decoder's C pass (collector/remote_write/_decode_c.c): optional the same way
# (wire.py's Python decoder reads the same series and refuses the same bodies).
decode_c = Extension("gpufleet.collector.remote_write._decode_c", ["collector/remote_write/_decode_c.c"],
                     optional=optional)
setup(packages=packages, package_dir=package_dir, ext_modules=[encode_c, decode_c])
