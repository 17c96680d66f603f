"""Print the core dependencies of pyproject.toml pinned to their declared floors (``name>=X`` -> ``name==X``), one
per line, for CI's minimum-versions step: a floor the code does not run on fails CI instead of a user's install."""

import pathlib
import re
import sys
import tomllib

project = tomllib.loads((pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
for requirement in project["dependencies"]:
    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*", requirement)
    if match is None:
        sys.exit(f"pyproject.toml: dependencies: {requirement!r} has no '>=' floor to pin")
    print(f"{match[1]}=={match[2]}")
