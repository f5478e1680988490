"""Print pins from pyproject.toml for the Makefile (the one place versions live).

    python tools/pins.py contract     # the --no-deps set of the contract environment
    python tools/pins.py extra gpu    # one optional-dependency group
"""

import sys
import tomllib
from pathlib import Path

data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
if sys.argv[1:2] == ["contract"]:
    print(" ".join(data["tool"]["grpo-course"]["contract-no-deps"]))
elif sys.argv[1:2] == ["extra"] and len(sys.argv) == 3:
    print(" ".join(data["project"]["optional-dependencies"][sys.argv[2]]))
else:
    sys.exit(__doc__)
