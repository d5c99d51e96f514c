"""``python -m fairclip.benchmarks [w1 ... w6] [--quick] [--json FILE] [--device cuda]``: the same
as ``fairclip bench ...`` (without importing the command line, which sits above the benchmarks)."""

import argparse
import sys
from pathlib import Path

from fairclip.root_error import FairclipError

from .run import failed_contenders, run_bench

parser = argparse.ArgumentParser(prog="python -m fairclip.benchmarks", description=__doc__)
parser.add_argument("workloads", nargs="*", help="workloads among w1 w2 w3 w4 w5 w6 [all]")
parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, no timing claims")
parser.add_argument("--json", dest="json_path", type=Path, help="write the JSON report here")
parser.add_argument("--device", default="cpu", help="cpu, or cuda: W2's contenders on the GPU (w2 only)")
arguments = parser.parse_args()
try:
    report = run_bench(arguments.workloads, arguments.quick, arguments.json_path, arguments.device)
except FairclipError as error:  # an unknown workload, say: one line, as the command line says it
    print(f"fairclip: error: {error}", file=sys.stderr)
    sys.exit(2)
if arguments.json_path is not None:
    print(f"report: {arguments.json_path}")
failed = failed_contenders(report)
if failed:
    print(f"failed: {', '.join(failed)}", file=sys.stderr)
    sys.exit(1)
