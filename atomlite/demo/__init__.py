"""The tiny bundled demo model and the tools that make it."""
