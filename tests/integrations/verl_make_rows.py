"""rollgym task rows (JSON lines) -> verl dataset rows (parquet) for the rollgym agent loop.

python verl_make_rows.py tasks.jsonl rows.parquet
"""

import sys

import orjson
import pandas as pd

from rollgym.integrations.verl import dataset_row

tasks_path, parquet_path = sys.argv[1], sys.argv[2]
with open(tasks_path, "rb") as f:
    tasks = [orjson.loads(line) for line in f if line.strip()]
pd.DataFrame([dataset_row(task, i) for i, task in enumerate(tasks)]).to_parquet(parquet_path)
