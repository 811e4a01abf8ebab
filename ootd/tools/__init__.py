"""Tools beside the product's path: the benchmarks (`ootd bench`, scripts/), `ootd doctor` and image comparison
(`ootd compare`). They use the library (and the benchmarks the application layer's RunConfig); the library and
the application layer never import them.
"""
