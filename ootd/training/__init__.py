"""Fine-tuning the try-on model (docs/training.md): the settings and their bounds, LoRA on the UNets' attention
projections (peft), the method's objective over the inference pipeline's own fusion, the training cache's records,
the data order that makes resumed and data-parallel runs exact, and the memory estimate.

The last library layer: imports the pipeline and what is below it; never the application layer or a front end.
"""
