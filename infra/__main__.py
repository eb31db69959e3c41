"""Entry point Pulumi runs (`main: infra/` in Pulumi.yaml)."""

import sys

from infra.config import ConfigError
from infra.program import main

try:
    main()
except ConfigError as exc:
    # One clear message naming file and key, not a traceback from inside the engine.
    print(str(exc), file=sys.stderr)
    sys.exit(1)
