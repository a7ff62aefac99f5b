"""The chaos suite: QoS 1 traffic across workers and nodes while faults are injected at random."""
