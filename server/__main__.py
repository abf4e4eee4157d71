"""`python -m server ARGS` is `specserve --no-profile ARGS` (launch/cli.py): the native engine
from the engine's defaults and the flags, speculating (3 steps) when --draft is given, through
the one launch path. The process is replaced, not imported into: server/ stays below launch/
(tests/test_import_graph.py), and the pid that receives SIGTERM is the server's."""
import os
import sys

os.execv(sys.executable, [sys.executable, "-m", "launch.cli", "--no-profile", *sys.argv[1:]])
