"""A program that makes no model and exits 0 (``python -m tests.workflows.idle_program
[sleep=S]``), after ``S`` seconds of doing nothing: a job that asks to promote its last
checkpoint must fail, saying why, not hang; a trainer held that long unused is said to be."""

import sys
import time

if __name__ == "__main__":
    args = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
    time.sleep(float(args.get("sleep", "0")))
    print("nothing to train", flush=True)  # noqa: T201
