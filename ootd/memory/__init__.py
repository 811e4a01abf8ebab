"""Memory: the plan for one call (what fits, what to offload, slice or tile), its estimates, model sizes and
activation traces, and the residency owner that puts the plan into effect and retries after out-of-memory.

Imports `ootd.hardware`, `ootd.attention`, `ootd.method` (tracing the fusion), `ootd.speedups` (compile
failures) and `ootd.weights` (released sizes).
"""
