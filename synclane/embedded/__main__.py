"""`python -m synclane.embedded upgrade [FOLDER]` (synclane.embedded.upgrade), and the
watchdog each process that uses the embedded server starts (`... watch FOLDER PID`)."""

import sys
from pathlib import Path

from synclane.embedded import watch_main
from synclane.embedded.upgrade import main

if sys.argv[1:2] == ["watch"]:
    sys.exit(watch_main(Path(sys.argv[2]), int(sys.argv[3])))
sys.exit(main(sys.argv[1:]))
