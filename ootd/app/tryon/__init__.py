"""One try-on, as every front end runs it:

    config.py      RunConfig (the run defaults) and build_config (user words -> validated config)
    request.py     TryOnRequest: person, garment, category, mask as paths, images or bytes, with their names
    job.py         prepare_job: every pre-flight check once, in one order -> TryOnJob (run, save)
    loader.py      config -> pipeline (PipelineLoader: one model at a time; the one seam to inject models)
    outputs.py     targets (output paths), saving atomically, PNG bytes, how a pipeline ran
    provenance.py  the PNG record: written once, read by resume, "is this our file" and recorded settings
    naming.py      the output name template (--name) and its fields
    masking.py     the mask alone (`ootd mask`) and checks on a given mask
    safety.py      never replace an input or a file that is not ours
    budget.py      --max-memory checked before loading
    tempfiles.py   stale temporary files of ours, removed
    grid.py        one try-on's contact sheet (person | garment | mask | samples)

Imports the library; never `ootd.app.batch`, a tool or a front end.
"""
