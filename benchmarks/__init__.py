"""Side-by-side benchmarks of hpc-train against what a user would otherwise run (see BENCHMARKS.md).

``python benchmarks/run.py [--quick]`` runs them all and writes ``benchmarks/results.json``; each module
here is one benchmark, ``reference.py`` holds the reference loops they are compared with, and
``tests/bench`` checks that those references compute what ours computes.
"""
