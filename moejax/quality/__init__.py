"""What a cache configuration costs the model's output, measured against the reference model
(the same model, every expert resident at native precision): per-token divergence of the
next-token distributions (`metrics`) and greedy drift (`drift`)."""
