"""Many try-ons: pairs, their pre-flight checks and resume, the JSON-lines report, the index.html contact sheet,
the local runner and the Ray engine.

    pairs.py       pairs from a CSV or two folders, shards
    folders.py     a folder's image files, and its entries named like images that cannot be read
    precheck.py    every pair checked before models load (the single try-on's checks per pair), resume states
    resume.py      the resume rule (done = outputs exist and record these settings)
    report.py      PairReport, BatchSummary, the locked, whole-line report writer, and reading a report back
    pages.py       what the contact sheet shows: its pages as HTML (front page, people x garments, errors)
    index.py       when and where the contact sheet is written: on a timer, the pages that changed, atomically
    runner.py      BatchRunner: the local engine (reuse of prepared inputs)
    cluster.py     ClusterOptions (where a distributed engine runs), checked before anything starts
    engines.py     the engines by name
    ray_engine.py  the same pairs on the actors of a Ray cluster
    ray_pool.py    those actors: one pair in flight each, fed as they free up, a dead one replaced, its pair retried

Builds on `ootd.app.tryon` and the library; never imports a tool or a front end.
"""
