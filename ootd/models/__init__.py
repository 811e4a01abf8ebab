"""The one owner of every network in the process: `Models`.

A front end (the CLI, the server, a Ray worker or replica, `run/run_ootd.py`, the ComfyUI nodes) makes one `Models`
from one `RuntimeRequest` and the checkpoints folder, and hands it down; every model anything runs comes from one
of its typed getters. Nothing here is global: two owners are two sets of models.

    models = Models(Path("checkpoints"), RuntimeRequest(device="cuda"))  # or Models.from_pretrained(words)
    pipe = models.pipeline(ModelType.HD, lora=None, progress=tick)       # the try-on pipeline (TryOnPipeline)
    models.preprocessor()                                                # pose + parsing (ootd/preprocessing.py)
    models.classifier()                                                  # CLIP's garment categories (`auto`)
    models.encoders()                                                    # VAE + CLIP encoders (`ootd train prepare`)
    models.trainable(ModelType.HD, settings)                             # a fine-tune's models (TrainingModels)
    models.metrics(MetricWeights.STANDARD)                               # the evaluation's networks
    models.components(ModelType.HD, precision)                           # one model type's networks (bench)
    models.runtime()                                                     # device, precision, attention: resolved once
    models.release()                                                     # everything held goes; or release(Kind.X)

What it guarantees: the runtime is resolved once, when the first model loads; each model loads when it is first
asked for and is then held; what may stay in memory together is decided here (`Keep`, `DISPLACES`: one try-on
pipeline at a time unless told otherwise, the classifier dropped when a try-on pipeline loads, the metric networks
and a fine-tune's models never beside a try-on pipeline); a load that failed with an OotdError is remembered and
raised again at once while the files it read are unchanged (a repaired or replaced checkpoint loads anew at the
next request, without a restart); a fine-tune's models are handed to each run with their adapters as made (a run
trains them in place; the next starts from the same adapter as the first; asking for them while a run holds them
is an error); every load reports ("load", done,
total) to the getter's `progress` and its seconds to `seconds` and `loads` (`timed()` measures the loads of a
block). Under each try-on pipeline its own ootd/memory/residency.py places the networks per memory plan, as
ComfyUI's loaded models sit under its model management.

Tests and embedding applications hand in models instead of the checkpoints with a `ModelSource`, given to one
owner or to every owner made inside a `use_models` block.

Modules: owner.py (`Models`, `Keep`, `Kind`), source.py (`ModelSource`, `use_models`), build.py (each kind built
from the checkpoints on the resolved runtime, and the files each reads), files.py (their state, what a failed load
is remembered against), training.py (`TrainingModels`, a fine-tune's models).
"""

from ootd.models.owner import DISPLACES, Keep, Kind, LoadTime, Models
from ootd.models.source import ModelSource, use_models

__all__ = ["DISPLACES", "Keep", "Kind", "LoadTime", "ModelSource", "Models", "use_models"]
