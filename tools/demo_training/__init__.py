"""The demo model's training: its data, the text model, the vision tower and the assistant (docs/DEMO_MODEL.md).
Run from the repository root: `python -m tools.demo_training.train --help`. Not part of the atomlite package."""
