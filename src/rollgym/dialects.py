"""The row dialects rollgym's entry points speak, listed once (DESIGN.md, "Layers and
dialects"): besides the flat row, built into the collector, each line is one folder's dialect
object. The CLI, the Ray collect workers and the trainer API pass this list down; a library
caller who builds a ``RolloutRunner`` or a run by hand speaks the flat row unless it passes one.
"""

from __future__ import annotations

from rollgym.collect.dialect import RowDialect
from rollgym.nemo_gym.rows import ROWS as NEMO_GYM_ROWS

ROW_DIALECTS: tuple[RowDialect, ...] = (
    NEMO_GYM_ROWS,  # NeMo Gym 0.7's materialized rows: episodes, task ids, its failure fields
)
