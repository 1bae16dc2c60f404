#!/usr/bin/env python3
"""Print the N-th ```bash code block of README.md (1-based), so CI runs the README's own
commands and the two cannot drift apart.

    python3 .ci/readme_block.py 1
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def bash_blocks(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)]


def main() -> int:
    n = int(sys.argv[1])
    blocks = bash_blocks((Path(__file__).resolve().parents[1] / "README.md").read_text())
    if not 1 <= n <= len(blocks):
        print(f"README.md has {len(blocks)} bash blocks, not {n}", file=sys.stderr)
        return 1
    print(blocks[n - 1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
