"""One registry per plug-in kind, tied to the names a job file may give (the config's Literal types): a name
the type admits but the registry lacks would crash every rank (exit 1) instead of being refused when the job
is read (exit 2), and a registry entry the type lacks could never be chosen."""

from typing import get_args

import pytest

from hpc_train.config import DatasetName, LossName, ModelName
from hpc_train.train.data.datasets import DATASETS
from hpc_train.train.model.losses import LOSSES
from hpc_train.train.model.models import MODELS


@pytest.mark.parametrize("registry, names", [(LOSSES, LossName), (MODELS, ModelName), (DATASETS, DatasetName)],
                         ids=["losses", "models", "datasets"])
def test_registry_keys_are_the_names_the_config_takes(registry, names):
    assert sorted(registry) == sorted(get_args(names))
