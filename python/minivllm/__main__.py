"""``python -m minivllm``: the ``minivllm`` command line (generate, serve, bench, ...)."""

import signal
import sys
from typing import List, Optional

from minivllm import _core


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # Ctrl-C ends a command as it ends the binary (`serve` handles it itself, to drain):
    # Python's own handler would only raise once the command returned.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_core.run_cli(["minivllm", *args]))


if __name__ == "__main__":
    main()
