"""The application layer: everything between the library and a front end, shared by all front ends.

    tryon/       one try-on: RunConfig, the request, the job (every pre-flight check once, run, save), its models,
                 outputs and their PNG record, names, masks, output safety, the memory budget
    batch/       many try-ons: pairs, precheck and resume, the report, index.html, the engines (local, Ray)
    train/       `ootd train`: prepare a cache, the fine-tune's loop, checkpoints, validation sheets, Ray Train
    console.py   for terminal front ends: every failure as one stderr line and an exit code, logging levels
    signals.py   SIGTERM handled like Ctrl-C, a full stdout reported like any full device

Front ends (`ootd/cli/`, `run/run_ootd.py`, `ootd/serve/`) and the tools call these; nothing here imports a front
end or a tool, and `tryon/` never imports `batch/`. Modules import torch only inside the functions that need it.
"""
