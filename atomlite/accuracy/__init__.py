"""Accuracy jobs: lm-eval against `atomlite serve`, compared with thresholds (catalog in ci/accuracy/)."""
