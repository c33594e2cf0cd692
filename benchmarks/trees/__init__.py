"""Source tree against source tree, loaded in one run (`benchmarks/compare_trees.py`)."""
