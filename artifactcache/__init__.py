"""artifactcache: build compiled PyTorch artifacts once, cache them by content, measure what that buys."""
