"""rollstream sandbox_workers (see DESIGN.md)."""
