"""Speed-ups, each a mode with its own settings, bounds and check, installed as a hook around the method:

    token_merge.py    ToMe in the fusion self-attention (changes the images)
    feature_cache.py  DeepCache-style reuse of the deep UNet levels (changes the images)
    quantize.py       int8/fp8 UNet Linear weights (changes the images)
    execution.py      channels_last layout and torch.compile (same computation)
    presets.py        SpeedModes: the modes together, the exact/fast presets, what outputs record

Imports `ootd.method`, `ootd.hardware`, `ootd.settings` and `ootd.errors`.
"""
