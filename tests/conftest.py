import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(autouse=True)
def _single_thread():
    import torch

    torch.set_num_threads(1)
    yield
