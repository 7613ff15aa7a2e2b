"""The quality benchmarks: the grid over the task suite, the adoption rule, and their reports."""
