"""What hardware is here and how to run on it: device detection, the device word, per-arch profiles, dtypes and
the device policy (precision, kernels, runtime environment, speed options a device supports).

Imports only `ootd.errors` and `ootd.settings`; nothing here imports torch at import time but `device.py`,
`policy.py` and `dtypes.py`, which the rest of the library reaches through.
"""
