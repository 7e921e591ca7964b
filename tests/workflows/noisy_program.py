"""A program that writes for a terminal (``python -m tests.workflows.noisy_program steps=N
...``): colours, a progress bar redrawn with carriage returns, a cursor move, bytes that are
not UTF-8 and a bell, on stdout and stderr, as rich, tqdm and colorama write them; then it
trains as examples/programs/tinker_sft.py does (with the same arguments), so that the job has
progress and a checkpoint to report. ``shepherd logs`` must show all of it as text."""

import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "programs" / "tinker_sft.py"

if __name__ == "__main__":
    out, err = sys.stdout.buffer, sys.stderr.buffer
    out.write(b"\x1b[1;32mready\x1b[0m to \x1b[38;5;208mtrain\x1b[0m\n")
    bar = b"".join(b"\r%3d%%|%-8s| %d/4" % (25 * i, b"#" * (2 * i), i) for i in range(5))
    err.write(bar + b"\n")
    out.write(b"caf\xe9 \xff\x07 done\n")
    err.write(b"\x1b[1A\x1b[2K\x1b[31mwarning\x1b[39m: in colour\n")
    out.flush()
    err.flush()
    runpy.run_path(str(SCRIPT), run_name="__main__")  # sys.argv is the script's too
