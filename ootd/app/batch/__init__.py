"""Many try-ons: pairs, their pre-flight checks and resume, the JSON-lines report, the index.html contact sheet,
the local runner and the Ray engine.

    pairs.py       pairs from a CSV or two folders, shards
    precheck.py    every pair checked before models load (the single try-on's checks per pair), resume states
    resume.py      the resume rule (done = outputs exist and record these settings)
    report.py      PairReport, BatchSummary and the locked, whole-line report writer
    index.py       index.html of a batch folder
    runner.py      BatchRunner: the local engine (reuse of prepared inputs)
    cluster.py     ClusterOptions (where a distributed engine runs)
    engines.py     the engines by name
    ray_engine.py  the same pairs on the actors of a Ray cluster

Builds on `ootd.app.tryon` and the library; never imports a tool or a front end.
"""
