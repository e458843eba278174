"""Runnable services and the ``rollstream`` CLI."""
