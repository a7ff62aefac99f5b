"""Agreement between the nodes (issue 41): a replicated state machine on Raft.

``state``: what is agreed (members, owners with epochs, in-sync followers), pure and sans-IO.
``raft``: the engine carrying it (PySyncObj). ``service``: the node's one member, a process of
its own (``brokerd-agree``) serving the node's workers. ``client``: a worker's side of it, on its
event loop, without the engine. docs/replication.md ("Agreement: the engine and why", "The
agreement service") says why this engine and how the pieces meet.
"""
