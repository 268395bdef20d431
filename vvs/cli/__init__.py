"""Command-line entry points, one module per command: ``vvs-export`` (:mod:`vvs.cli.export`), ``vvs-run``,
``vvs-bench``, ``vvs-serve`` and ``vvs-train``, each with a ``main``; what they share is :mod:`vvs.cli.common`."""
