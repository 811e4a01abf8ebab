"""One try-on job (one garment or an outfit), as every front end runs it:

    settings.py     every setting declared once (type, bounds, default, help, flag, API field, record, front ends)
    declaration.py  how a setting is declared (Setting, Recorded) and the registry of them (Settings)
    config.py       RunConfig and build_config / update_config (user words -> validated config), from settings.py
    sizes.py        a memory size as a user gives it (ByteSize, parse_size)
    inputs.py       JobInputs: the person photo and its garments (category, mask, names) as paths, images or bytes
    autocategory.py `auto` categories resolved (resolve_inputs) by the model owner's classifier
    job.py          plan_job -> TryOnJob: its passes (one garment or two), run, save; JobOutcome
    passes.py       one pass: a garment tried on the photo or on the pass before's results; seeds, the one parse
    preflight.py    every pre-flight check in one order, per pair or per batch: prepare_job, check_batch
    record.py       the typed record of a picture: its PNG text, JSON, what resume expects
    provenance.py   reading a PNG's record back: "is this our file", how it differs from what is expected
    request.py      TryOnRequest: one pass's person, garment, category and mask
    loader.py       config -> the model owner (models_for, ootd/models/); hardware and checkpoint checks
    outputs.py      targets (output paths), saving atomically, PNG bytes, how a pipeline ran
    outcome.py      one finished pass (TryOnOutcome), the caches a batch hands in
    naming.py       the output name template (--name) and its fields
    masking.py      the mask alone (`ootd mask`: MaskJob) and checks on a given mask
    safety.py       never replace an input or a file that is not ours
    budget.py       --max-memory checked before loading
    tempfiles.py    stale temporary files of ours, removed
    grid.py         one try-on's contact sheet (person | garment | mask | samples)

Imports the library; never `ootd.app.batch`, a tool or a front end.
"""
