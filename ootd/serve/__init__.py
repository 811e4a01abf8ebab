"""`ootd serve`: the try-on page and HTTP API, a front end on the application layer (`ootd.app`).

    limits.py   upload size (enforced while streaming), queue length, authentication
    worker.py   the one thread that owns the device: a bounded line of jobs, progress for whoever waits
    service.py  the pipelines kept loaded, one request through `run_tryon`, its PNGs
    forms.py    a multipart request -> a checked job, or one line with its HTTP status
    app.py      the FastAPI routes and the error mapping
    server.py   host/auth policy, the per-process temporary folder, uvicorn
    static/     the page (plain HTML, CSS and JavaScript, no CDN) and its example images

FastAPI, uvicorn and python-multipart come with the `serve` extra; nothing here is imported by the library or
the application layer.
"""

from ootd.serve.limits import Auth, Limits

__all__ = ["Auth", "Limits"]
