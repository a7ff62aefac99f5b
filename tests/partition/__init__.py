"""The partition suite: the chaos scenario on nodes in network namespaces, faults on real links."""
