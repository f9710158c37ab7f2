"""Every test here runs against the PopTorch stand-in (tests/standin), importable in this process and in
the processes the tests start (the conformance kit's fresh script) through PYTHONPATH."""

import os
import sys
from pathlib import Path

STANDIN = str(Path(__file__).parent / "standin")

if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [STANDIN, os.environ.get("PYTHONPATH")]))
