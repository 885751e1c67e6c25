"""The GPU checks at the path the project's rules name: `python benchmarks/gpu_checks.py [flags]`
is `python -m benchmarks.checks gpu [flags]`; benchmarks/checks/gpu.py says what they check.

    PYTHONPATH=. python benchmarks/gpu_checks.py --jobs 8
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.checks.gpu import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
