"""A plugin module that fails at import time (a missing dependency)."""

import fitplan_dependency_that_is_not_installed  # noqa: F401
