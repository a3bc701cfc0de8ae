"""What the thin bench wrappers share. Importing it first lets ``python bench/<script>.py`` run from a checkout with an
in-place build (``python setup.py build_ext --inplace``) when paddle_rt is not installed."""
import argparse
import json
import os
import sys

try:
    import paddle_rt  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import paddle_rt  # noqa: F401


def quick_parser(default_reps, quick_reps, fewer):
    """The options of the wrappers over a paddle_rt.bench module's measure(): --quick, --reps, --json."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help=f"fewer repetitions and {fewer}")
    ap.add_argument("--reps", type=int, default=None,
                    help=f"repetitions (default {default_reps}, quick {quick_reps})")
    ap.add_argument("--json", action="store_true")
    return ap


def print_rows(bench_module, rows, as_json):
    """The rows of bench_module.measure() as JSON or as the module's own table."""
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        print(bench_module.format_rows(rows))
