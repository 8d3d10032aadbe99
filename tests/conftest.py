"""The fixtures dsn, schema, app and db come from synclane's own pytest plugin
(synclane/testing_plugin.py), the one users get: a real PostgreSQL ($SYNCLANE_TEST_DSN, which CI
sets to the machine's PostgreSQL 15, else the embedded one) and a schema per test.

Installing synclane (`pip install -e '.[dev]'`) registers the plugin; where plugins are not
loaded automatically (PYTEST_DISABLE_PLUGIN_AUTOLOAD) it is loaded here.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    plugins = config.pluginmanager
    if not (plugins.has_plugin("synclane") or plugins.has_plugin("synclane.testing_plugin")):
        plugins.import_plugin("synclane.testing_plugin")
