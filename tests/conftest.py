"""Settings for the whole test run."""
import shutil
import tempfile
from functools import partial

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Temporary folders under a short path wherever TMPDIR points (unless --basetemp names one).

    Tests start Ray with its session files in their own folder, and Ray's AF_UNIX sockets there must fit 107
    bytes: a folder under a long TMPDIR leaves no room for `session_<date>_<pid>/sockets/plasma_store`.
    """
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="pytest-", dir="/tmp")
        config.add_cleanup(partial(shutil.rmtree, config.option.basetemp, ignore_errors=True))
