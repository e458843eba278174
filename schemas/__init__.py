"""Message contracts of rollstream: structs, codec, topic registry.

Imports neither torch nor aiokafka, so any service or outside producer can use it cheaply.
"""
