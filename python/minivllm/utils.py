"""vLLM's ``FlexibleArgumentParser`` (``vllm.utils``), which its example scripts build their
command line with: argparse's, taking ``--flag_name`` as ``--flag-name`` too."""

from __future__ import annotations

import argparse
from typing import List, Optional, Sequence


class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_args(self, args: Optional[Sequence[str]] = None, namespace=None):  # type: ignore[override]
        import sys

        raw: List[str] = list(sys.argv[1:] if args is None else args)
        fixed = []
        for a in raw:
            if a.startswith("--") and "_" in a.split("=", 1)[0]:
                key, *value = a.split("=", 1)
                a = "=".join([key.replace("_", "-"), *value])
            fixed.append(a)
        return super().parse_args(fixed, namespace)
