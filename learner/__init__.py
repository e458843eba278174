"""rollstream learner (see DESIGN.md)."""
