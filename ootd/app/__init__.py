"""The application layer: everything between the library and a front end, shared by all front ends.

    config.py   RunConfig (the run defaults) and build_config (user words -> validated config)
    load.py     config -> TryOnPipeline, PipelineLoader (one model type held at a time), checkpoint pre-check
    tryon.py    TryOnRequest -> run_tryon -> TryOnOutcome: the one try-on sequence
    naming.py   the output name template (--name) and its fields
    outputs.py  output names, PNG metadata, saving to files or encoding to bytes, pipeline description
    masking.py  the mask alone (pose + parsing, no diffusion models) and checks on a given mask
    contact.py  contact sheets: a try-on's grid PNG, a batch folder's index.html
    pairs.py    many requests: pairs from a CSV or two folders, shards
    resume.py   the resume rule every batch engine shares (done = outputs exist with these settings)
    batch.py    the local batch engine (reuse of prepared inputs, resume, JSON-lines report)

Front ends (`ootd/cli/`, `run/run_ootd.py`, the web service, the distributed driver) call these; this package
never imports a front end. Modules import torch only inside the functions that need it.
"""
