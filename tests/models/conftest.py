"""Fixtures for the model tests. Helpers live in ``tests/support/models.py`` and the numpy
reference in ``mtp_numpy_reference.py`` (a unique module name, importable from this directory)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fastdeploy_mtp.models import load_model  # noqa: E402
from tests.support.models import build_models, small_config  # noqa: E402


@pytest.fixture
def config():
    return small_config()


@pytest.fixture
def models(config):
    return build_models(config)


@pytest.fixture(scope="module")
def loaded(folder):
    """(target, mtp, config) of the module's ``folder`` fixture (a model folder's info)."""
    return load_model(folder.path)
