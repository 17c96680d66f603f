"""CI's pyright step: zero errors (basic mode, pyproject's [tool.pyright]) on all package code, models/, solvers/ and
optimizer/ (docs/development.md, "Static checks")."""

import json
import subprocess
import sys


def errors(*paths: str) -> list[dict]:
    run = subprocess.run(["pyright", "--outputjson", *paths], capture_output=True, text=True)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        sys.exit(f"pyright did not run: {run.stdout[-2000:]}{run.stderr[-2000:]}")
    return [d for d in report["generalDiagnostics"] if d["severity"] == "error"]


found = errors("models", "solvers", "optimizer")
for d in found:
    print(f"{d['file']}:{d['range']['start']['line'] + 1}: {d.get('rule', '')}: {d['message'].splitlines()[0]}")
print(f"pyright: {len(found)} errors in models/, solvers/ and optimizer/ (allowed 0)")
if found:
    sys.exit(1)
