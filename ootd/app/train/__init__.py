"""`ootd train`: the training set's layouts, prepare (pairs -> the cache), the loop
with its checkpoints, validation sheets and loss log, the --explain estimate, and the Ray Train engine."""
