"""ootd's nodes for ComfyUI, a front end on the application layer (`ootd.app`), like the CLI and the server.

    backend.py    what the nodes take from the rest of ootd: the settings they offer (the HTTP API's names) and
                  their `build_config` keywords, the model handle and the models shared across nodes and prompts,
                  the library's messages in the nodes' words (the one module to change when those move)
    tensors.py    ComfyUI's IMAGE and MASK tensors <-> pictures, exactly (8-bit levels survive both ways)
    jobs.py       the nodes' work in ootd's terms: the try-on job, the mask, the category; nothing written
    report.py     the try-on's performance text
    host.py       ComfyUI's side: its device, its model management (room made before loading, ootd's models
                  counted and released when it asks), Cancel at the next step, the progress bar
    nodes.py      the nodes in ComfyUI's V3 schema, and `comfy_entrypoint`
    install.py    `ootd comfyui install|uninstall`: the shim in custom_nodes/ootd and the example workflows
    example_workflows/   UI format (ComfyUI's templates), and the API format a script posts (api/)

host.py and nodes.py import ComfyUI's modules, so only ComfyUI imports them; nothing here is imported by the
library or the application layer, and no other front end is imported (the CLI imports install.py only).
"""
