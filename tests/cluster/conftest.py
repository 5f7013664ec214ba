"""tests/cluster runs only under `make test-cluster` (tests/cluster/run.sh starts the Slurm,
PostgreSQL and MLflow server it needs and sets DAREL_MLFLOW_URI); in `make test` every test
here is skipped with that reason."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("DAREL_MLFLOW_URI"):
        return
    skip = pytest.mark.skip(reason="cluster test: run by `make test-cluster` (needs root, apt, a one-node Slurm)")
    for item in items:
        if "tests/cluster/" in str(item.path):
            item.add_marker(skip)
