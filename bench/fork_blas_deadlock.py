"""fork() beside a multi-threaded numpy matmul (tests/conftest.py sets OPENBLAS_NUM_THREADS=1).

    timeout 60 uv run python bench/fork_blas_deadlock.py                          # hangs here
    OPENBLAS_NUM_THREADS=1 timeout 60 uv run python bench/fork_blas_deadlock.py   # ~2,000 forks

One thread multiplies matrices of the registry encoder's shapes without pause; the main thread
starts `/bin/true` with a preexec_fn (a real fork(), as toolbus_devstack's `spawn` does) for 20 s.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import numpy as np

running = True


def multiply() -> None:
    a = np.random.rand(384, 1536).astype(np.float32)
    b = np.random.rand(1536, 384).astype(np.float32)
    while running:
        a @ b


def main() -> None:
    global running
    threading.Thread(target=multiply, daemon=True).start()
    start, forks = time.monotonic(), 0
    while time.monotonic() - start < 20:
        subprocess.Popen(["/bin/true"], preexec_fn=lambda: None).wait()
        forks += 1
    running = False
    print(f"{forks} forks in 20 s, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")


if __name__ == "__main__":
    main()
