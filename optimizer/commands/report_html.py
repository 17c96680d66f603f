"""``fleetopt report RESULT.json -o report.html``: load a result JSON, build the self-contained page
(:func:`fleetopt.optimizer.workflows.html_report.build_html`), write it atomically, exit. The entry point loads it
lazily as ``fleetopt.optimizer.commands.report_html:report``.

Errors are one line on stderr and exit code 2 (an unreadable or foreign input, a ``--sim`` of another plan, an
output that would overwrite an input), as the main command's guard does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import click
from pydantic import ValidationError

from fleetopt.optimizer.commands import CONTEXT_SETTINGS
from fleetopt.optimizer.commands import guard as _guard
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.output.contract import KINDS, validate_document
from fleetopt.optimizer.io.schema import pydantic_field_path, pydantic_message
from fleetopt.optimizer.io.files import read_bytes, read_text
from fleetopt.optimizer.workflows.html_report import build_html, detect_kind
from fleetopt.optimizer.workflows.plots import write_atomic

__all__ = ["report", "load_result"]


def load_result(path: str, flag: str = "RESULT") -> dict:
    """A result JSON file as a dict; one-line :class:`InstanceError` naming the file when it cannot be read."""
    p = Path(path)
    text, reason = read_text(p)
    if text is None:
        raise InstanceError(f"{flag}: {path}: cannot read: {reason}")
    try:
        data = json.loads(text)
    except RecursionError:
        raise InstanceError(f"{flag}: {path}: JSON nested too deeply to read") from None
    except json.JSONDecodeError as err:
        raise InstanceError(f"{flag}: {path}: not JSON: line {err.lineno} column {err.colno}: {err.msg}") from None
    detect_kind(data, f"{flag}: {path}")
    _check_contract(data, f"{flag}: {path}")
    return data


def _present(data, loc: tuple) -> tuple:
    """The part of a pydantic error location that lies in ``data`` (a union's branch names dropped)."""
    out, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) \
                and 0 <= part < len(node):
            out.append(part)
            node = node[part]
    return tuple(out)


EARLIER_VERSIONS = ("2.0", "2.1", "2.2", "2.3", "2.4")
"""``schema_version`` values of earlier contracts whose documents may lack keys the current one added: the page
renders what they hold (:func:`detect_kind`'s checks name the keys it cannot do without)."""


def _check_contract(data: dict, where: str) -> None:
    """Each key of the JSON contract (:mod:`fleetopt.optimizer.output.contract`) is present with its contract's
    type, so the page renders what the command wrote: one :class:`InstanceError` line naming the first field that
    is not. A document of an earlier contract (:data:`EARLIER_VERSIONS`) may lack keys; any other document,
    whatever its ``schema_version`` says, is held to the current contract."""
    if data.get("command") not in KINDS:
        return  # a legacy tpw table without a command
    earlier = data.get("schema_version") in EARLIER_VERSIONS
    try:
        validate_document(data)
    except ValidationError as err:
        for error in err.errors():
            if (error["type"] == "missing" and earlier) or error["loc"][:1] == ("schema_version",):
                continue
            loc = _present(data, error["loc"])
            if error["type"] == "missing":      # the key itself is not in the data: name it after its parent
                loc = _present(data, error["loc"][:-1]) + error["loc"][-1:]
            raise InstanceError(f"{where}: {pydantic_field_path(loc) or 'the top level'}: "
                                f"{pydantic_message({**error, 'loc': loc}, lambda _loc: '')}") from None


def _sha256(path: str) -> str:
    """The SHA-256 of an input already read whole (:func:`load_result`), for the page's provenance."""
    data, reason = read_bytes(Path(path))
    if data is None:
        raise InstanceError(f"{path}: cannot read: {reason}")
    return hashlib.sha256(data).hexdigest()


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("result", type=click.Path(dir_okay=True))
@click.option("-o", "--output", required=True, metavar="FILE.html", help="The page to write (atomically).")
@click.option("--sim", "sim_file", metavar="SIM.json", help="With a solve result: the simulate JSON of the same plan.")
@_guard
def report(result, output, sim_file):
    """A self-contained HTML page (tables, pool diagram, figures, provenance) from the JSON of solve, simulate,
    pareto --split-table, pareto --axes, whatif, gridflex, headroom or tpw."""
    out = Path(output)
    for name, path in (("RESULT", result), ("--sim", sim_file)):
        if path is not None and Path(path).exists() and out.resolve() == Path(path).resolve():
            raise InstanceError(f"--output: {output}: refusing to overwrite the input {name} file")
    if out.is_dir():
        raise InstanceError(f"--output: {output}: is a folder; name the page to write")
    if not out.parent.exists():
        raise InstanceError(f"--output: {output}: folder {out.parent} does not exist")
    data = load_result(result)
    sim = None if sim_file is None else load_result(sim_file, "--sim")
    inputs = [(Path(p).name, _sha256(p)) for p in (result, sim_file) if p is not None]
    try:
        page = build_html(data, sim=sim, source=f"RESULT: {result}", sim_source=f"--sim: {sim_file}", inputs=inputs)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as err:
        # The contract checks each key's type at its declared looseness; an edited document can still hold a
        # value the page cannot use (a mapping where the baseline's cost is read). Such a file is bad input, not
        # a crash; what fleetopt writes renders (tests/test_html_report.py renders every kind of document).
        files = f"RESULT: {result}" + (f" / --sim: {sim_file}" if sim_file else "")
        raise InstanceError(f"{files}: holds a value the page cannot render ({type(err).__name__}: "
                            f"{' '.join(str(err).split())[:120]}); give the JSON a fleetopt command wrote") from None
    write_atomic(out, page.encode("utf-8"))
    kind = detect_kind(data)
    click.echo(f"wrote {output} ({len(page.encode('utf-8')) / 1024:,.0f} KiB): the {kind} result {result}"
               + (f" with the simulation {sim_file}" if sim_file else "") + "; every figure and table names its "
               "source (analytic, MIP or oracle selection, simulated)")
