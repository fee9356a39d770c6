"""Until pool-core's ``pwkernel/backends/ray/tenancy.py`` is on this branch, the pool CLI's
tests run against a stand-in of the same functions (``tenancy_standin.py``): this file, on
the PYTHONPATH of the CLI's subprocesses and of the pool's Ray workers, makes
``import pwkernel.backends.ray.tenancy`` load the stand-in ONLY when the real module is not
found (the finder is the last one asked). Once the real one exists it is used, unchanged."""

import importlib.util
import sys
from pathlib import Path

_NAME = "pwkernel.backends.ray.tenancy"
_FILE = Path(__file__).with_name("tenancy_standin.py")


class _StandInFinder:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != _NAME:
            return None
        return importlib.util.spec_from_file_location(fullname, _FILE)


sys.meta_path.append(_StandInFinder())
