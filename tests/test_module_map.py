"""The package's module map lists every module (and nothing that is gone)."""
import re

import workshop_lib
from conftest import REPO

PACKAGE = REPO / "workshop_lib"


def test_the_module_map_lists_every_module():
    listed = set(re.findall(r"^- ``(\w+)``", workshop_lib.__doc__, re.M))
    present = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    present |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert listed == present, (f"missing from the map: {sorted(present - listed)}; "
                               f"listed but gone: {sorted(listed - present)}")
