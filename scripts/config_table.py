"""Print docs/configuration.md's table of configuration keys, rendered from the fields of
relay/options.py (tests/ops/test_ops_config.py fails while the docs hold anything else).

    .venv/bin/python scripts/config_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relay.options import settings_table

if __name__ == "__main__":
    sys.stdout.write(settings_table())
