"""``python -m fairclip.benchmarks ...``: the same as ``fairclip bench ...``."""

import sys

from fairclip.cli import main

main(["bench", *sys.argv[1:]])
