"""The reentrant trainer lives in examples/quickstart/train.py, a job's code directory beside its
requirements.txt (docs/guides/code.md); this path keeps working for the drill and older notes."""

import os
import runpy

runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart", "train.py"), run_name="__main__")
