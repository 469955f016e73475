#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Run the metrics tests with pytest; exit 77 (skipped) if pytest or
prometheus_client is not installed for this interpreter."""
import os
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree

try:
    import prometheus_client  # noqa: F401
    import pytest
except ImportError as e:
    print(f"skipped: {e} (apt-get install python3-pytest python3-prometheus-client)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", here,
                      "-ra", "-v", os.path.join(here, "test_metrics.py")] + sys.argv[1:]))
