"""`ootd serve`: the try-on page and HTTP API, a front end on the application layer (`ootd.app`).

    limits.py     upload size (enforced while streaming), queue length, steps and samples per request, auth
    origins.py    the host names it answers to (DNS rebinding) and the other sites allowed to post (CORS)
    access.py     one access-log line per request, with its time
    worker.py     the one thread that owns the device: a bounded line of jobs, progress, cancellation
    service.py    the pipelines kept loaded, one request run through the try-on job, its PNGs
    forms.py      a multipart request -> a checked job, or one line with its HTTP status
    messages.py   every failure -> a status and one line for clients (the API's words, no server paths)
    schema.py     what /openapi.json says about the form and the answers
    app.py        the FastAPI routes
    workspace.py  the per-process temporary folder, locked while alive; dead servers' folders removed
    server.py     host/auth policy, the socket, uvicorn, stopping on signals
    ray_engine.py `--engine ray`: the app's worker over a Ray Serve deployment (routing, line, replicas)
    ray_replica.py  the Ray Serve replica: one pipeline on one device, its jobs streamed back
    static/       the page (plain HTML, CSS and JavaScript, no CDN: app.js the page, editor.js the mask editor
                  with a mask per garment, zip.js "download all"), its icon and example images

FastAPI, uvicorn and python-multipart come with the `serve` extra, Ray Serve with `ray-serve`; nothing here is
imported by the library or the application layer.
"""

from ootd.serve.limits import Auth, Limits

__all__ = ["Auth", "Limits"]
