"""One contender in a fresh process:
``python -m benchmarks.child WORKLOAD CONTENDER [--quick] [--device cuda]`` (W2 alone takes a device).

Prints one ``BENCH-RESULT {json}`` line (see :mod:`benchmarks.common`), or
``BENCH-UNAVAILABLE reason`` for a contender that cannot run on this machine.
"""

from __future__ import annotations

import sys

UNAVAILABLE_MARKER = "BENCH-UNAVAILABLE "


def contenders(workload: str) -> dict:
    if workload == "w1":
        from . import w1

        return w1.CONTENDERS
    if workload == "w2":
        from . import w2

        return w2.CONTENDERS
    if workload == "w3":
        from . import w3

        return w3.CONTENDERS
    if workload == "w4":
        from . import w4

        return w4.CONTENDERS
    if workload == "w5":
        from . import w5

        return w5.CONTENDERS
    if workload == "w6":
        from . import w6

        return w6.CONTENDERS
    raise SystemExit(f"unknown workload {workload!r}")


def main(argv: list[str]) -> int:
    import json

    from .common import RESULT_MARKER, emit
    from .w1 import UnavailableError

    quick = "--quick" in argv
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    positional = [a for i, a in enumerate(argv) if not a.startswith("--") and argv[i - 1] != "--device"]
    workload, contender = positional[:2]
    run = contenders(workload)[contender]
    try:
        measurement = run(quick) if device == "cpu" else run(quick, device=device)
    except UnavailableError as reason:
        print(UNAVAILABLE_MARKER + str(reason).replace("\n", " "), flush=True)
        return 0
    if isinstance(measurement, dict):  # several contenders from one process (W2, W4, W6)
        print(RESULT_MARKER + json.dumps({k: m.as_dict() for k, m in measurement.items()}), flush=True)
    else:
        emit(measurement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
