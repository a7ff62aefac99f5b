"""Agreement between the nodes (issue 41): a replicated state machine on Raft.

``state``: what is agreed (members, owners with epochs, in-sync followers), pure and sans-IO.
``raft``: the engine carrying it (PySyncObj, the optional ``agreement`` extra). Nothing in the
broker uses it yet; docs/replication.md ("Agreement: the engine and why") says why this engine.
"""
