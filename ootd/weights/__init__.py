"""The checkpoints: the released layout and its facts, downloading, verifying files, loading them with stock
diffusers/transformers classes, and the checks that refuse damaged weights.

Imports `ootd.errors`, `ootd.settings` and `ootd.hardware` (dtypes); never the method, the pipeline or above.
"""
