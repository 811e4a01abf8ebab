"""Try-on metrics against real photos: what owns the numbers of `ootd eval` and `ootd batch --truth`.

    framing.py   the one rule that brings a real photo to a result's frame (centre crop to its aspect, Lanczos)
    weights.py   the published networks' weight files: which, where they live (torch's hub cache), fetching them
    networks.py  the networks the metrics run on: torch-fidelity's InceptionV3 (FID/KID features) and LPIPS's
                 AlexNet (the `eval` extra), or randomly initialised stand-ins (the model owner loads them)
    sets.py      FID and KID of two sets of features (torchmetrics' estimators, fed features computed here;
                 FID's running sums, KID's bounded reservoir sample)
    scoring.py   per-pair SSIM (ootd/imaging/similarity.py) and LPIPS, and the sets' features, a batch of images at
                 a time

The library under the application layer: imports errors, settings, hardware and imaging; torch, torchmetrics and
the networks' packages only inside the functions that use them, so `ootd --help` never loads them.
"""
