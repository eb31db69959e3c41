"""``python3 agent.pyz ENTRY``: see agent.main."""

import sys

from agent.main import main

sys.exit(main(sys.argv[1:]))
