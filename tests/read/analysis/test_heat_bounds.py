"""The rank x step heat strip's grid stays bounded on sparse rows (one job whose rank i has a
row only at step i: a 30,000 x 30,000 grid unbounded, 7 GB) and stays exact where it fits."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.read.analysis.rank_pick import MAX_HEAT_CELLS, MAX_HEAT_ROWS, rank_step_matrix

ROOT = Path(__file__).resolve().parents[3]


def test_sparse_steps_make_a_bounded_grid_under_a_memory_cap():
    code = ("from tests.memlimit import limit_address_space; limit_address_space(1500)\n"
            "import numpy as np, pandas as pd\n"
            "from dpcore.read.analysis.rank_pick import rank_step_matrix\n"
            "n = 30000\n"
            "df = pd.DataFrame({'rank': np.arange(n), 'step': np.arange(n), 'step_ms': np.ones(n)})\n"
            "m = rank_step_matrix(df)\n"
            "print(m.shape[0], m.shape[1], int(m.notna().sum().sum()), float(np.nanmean(m.to_numpy())))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-1500:]
    rows, cols, filled, mean = out.stdout.split()
    assert int(rows) <= MAX_HEAT_ROWS and int(rows) * int(cols) <= MAX_HEAT_CELLS
    # 8 ranks a row; their 8 steps fall in one or two columns
    assert int(rows) == 3750 and 3750 <= int(filled) <= 7500 and float(mean) == 1.0


def test_a_grid_that_fits_is_exact_and_a_binned_one_averages_neighbours():
    df = pd.DataFrame({"rank": [0, 0, 1, 1, 1], "step": [1, 2, 1, 2, 2],
                       "step_ms": [1.0, 2.0, 3.0, 4.0, 6.0]})
    m = rank_step_matrix(df)
    assert m.index.tolist() == [0, 1] and m.columns.tolist() == [1, 2]
    assert m.to_numpy().tolist() == [[1.0, 2.0], [3.0, 5.0]]
    b = pd.DataFrame({"rank": np.repeat([0, 1], 10), "step": np.tile(np.arange(10) * 3, 2),
                      "step_ms": np.arange(20.0)})
    binned = rank_step_matrix(b, max_cells=10)
    assert binned.columns.tolist() == [0, 6, 12, 18, 24]  # each cell: two steps, labelled by the first
    assert binned.loc[0].tolist() == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert binned.loc[1].tolist() == [10.5, 12.5, 14.5, 16.5, 18.5]
