"""The Hot PATE benchmarks: coverage of coordinated ensembles, and private-token yields."""
