"""`brokerd keygen`: the CURVE key pair that authenticates and encrypts mesh traffic between nodes.

One key pair per cluster: every node is started with ``--mesh-key`` pointing at the same
``.key_secret`` file. A node's mesh listener accepts only peers that prove they hold that key
(ZeroMQ CURVE with a ZAP check of the client key), so a node without it cannot join, and both
sides log the refused handshake.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="brokerd keygen", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="./cluster", metavar="PATH",
                   help="write PATH.key (public) and PATH.key_secret (give this one to --mesh-key); "
                   "default ./cluster")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    args = p.parse_args(argv)
    import zmq.auth

    directory, name = os.path.split(os.path.abspath(args.out))
    secret = os.path.join(directory, name + ".key_secret")
    if os.path.exists(secret) and not args.force:
        print(f"brokerd keygen: error: {secret} exists (use --force to replace it)", file=sys.stderr)
        return 2
    os.makedirs(directory, exist_ok=True)
    public_file, secret_file = zmq.auth.create_certificates(directory, name)
    os.chmod(secret_file, 0o600)
    print(f"public key: {public_file}\nsecret key: {secret_file}  (start every node with --mesh-key {secret_file})")
    return 0
