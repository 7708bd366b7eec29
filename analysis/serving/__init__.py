"""Serving replicas judged by the requests they serve within their SLOs (docs/serving.md).

Pure functions over per-minute serving measures (gpufleet/serving_expo.py): histograms stay
histograms, so percentiles and SLO attainment are computed from bucket counts, not guessed.
"""
