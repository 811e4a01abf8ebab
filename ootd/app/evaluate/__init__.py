"""Try-on results measured against real photos: `ootd eval` and `ootd batch --truth`.

    matching.py  which photo each result is measured against (--pairs, the batch report, the PNG record, the
                 name), and what is skipped and why
    run.py       EvalOptions and one evaluation: each image read once, scored a batch at a time
    report.py    EvalReport: the numbers, the pairs worst first, the skipped; lines and JSON
    pages.py     eval.html and the block a batch's index.html shows
    folder.py    a batch folder's evaluation: eval.json, eval.html, index.html's block, written atomically

Builds on `ootd.evaluation` (the metrics), `ootd.app.tryon` (the PNG record) and `ootd.app.batch` (its report's
and pages' names); neither of those imports this. Never imports a tool or a front end.
"""
