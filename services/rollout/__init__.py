"""Rollouts (DESIGN.md section 7): the task feeder, the generators and the demo's parts.

Pure logic (no Kafka, no torch) lives in `pacing`, `sampler`, `admission`, `episode` and
`stats`; the services (`feeder`, `generator`) and helpers that touch Kafka, Redis, Docker
or torch import them. Every heavy import stays inside the modules that need it.
"""
