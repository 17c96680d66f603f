"""``fleetopt.models.numerics.unique``: the values ``np.unique`` gives, and no ``numpy.ma`` loaded on the way."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleetopt.models.numerics import unique

REPO = Path(__file__).resolve().parents[1]


@given(hnp.arrays(dtype=st.sampled_from([np.float64, np.int64]),
                  shape=hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=40)))
def test_unique_is_numpys_unique(values):
    """Any 1-D or 2-D array of floats (NaN and infinities among them) or integers."""
    np.testing.assert_array_equal(unique(values), np.unique(values))
    assert unique(values).dtype == np.unique(values).dtype


def test_unique_collapses_nans_and_flattens_as_numpy_does():
    values = np.array([[2.0, np.nan], [np.nan, 1.0]])
    np.testing.assert_array_equal(unique(values), [1.0, 2.0, np.nan])
    assert unique([]).size == 0


def test_a_solve_leaves_numpy_ma_unloaded():
    """The stress instance (bounded sizing, the MIP, the document): every distinct-values call goes through
    ``unique``, so nothing loads ``numpy.ma``, which a plain ``np.unique`` of NumPy 2.3+ imports."""
    code = ("import json, sys\nfrom fleetopt.optimizer.cli import main\n"
            f"sys.argv = ['fleetopt', 'solve', {str(REPO / 'instances' / 'ref_units_stress_60x8.yaml')!r}, "
            "'--json', '/dev/null']\n"
            "try:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0, done.code\n"
            "print(json.dumps('numpy.ma' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False
