"""The peak resident memory ``vvs-run``, ``vvs-bench`` and the benchmarks report is the process's own."""
import subprocess
import sys
import textwrap

CHILD = "from vvs.memory import peak_resident_bytes; print(peak_resident_bytes())"
PARENT = textwrap.dedent(f"""
    import subprocess, sys
    held = bytearray(1 << 30)
    held[::4096] = b"x" * len(held[::4096])  # resident, not only reserved
    print(subprocess.run([sys.executable, "-c", {CHILD!r}], capture_output=True, text=True, check=True).stdout)
""")


def test_a_child_of_a_large_process_reports_its_own_peak():
    """A 1 GiB parent starts a small child (as ``bench/peers.py`` starts one process per image): the child's peak is
    its own interpreter's, not the parent's (``ru_maxrss`` carries the parent's over ``exec``: it read 8.1 GiB for a
    4.5 GiB decode under a parent that had written a checkpoint)."""
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, check=True)
    peak = int(out.stdout.split()[-1])
    assert 10 * 2**20 < peak < 512 * 2**20, peak
