"""brokerd's benchmark: a load generator of its own and the scenarios of the Open MQTT Benchmark Suite.

Run it with ``./scripts/bench`` (the launcher next to this package). Nothing here imports the broker:
the generator speaks MQTT 3.1.1 with hand-encoded bytes, so a run measures the broker and not a
client library that shares its code.
"""
