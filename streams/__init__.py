"""rollstream streams (see DESIGN.md)."""
