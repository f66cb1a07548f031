"""Reproducible measurements of Dataoad's overhead, as ratios to floors measured beside it."""
