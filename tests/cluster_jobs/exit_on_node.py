"""A torchrun job that needs no process group: node --node exits --code, the
others exit 0 after --sleep seconds (tests the worst-code and teardown paths)."""

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--node", type=int, default=-1)
p.add_argument("--code", type=int, default=0)
p.add_argument("--sleep", type=float, default=0.0)
args = p.parse_args()

node = int(os.environ["GROUP_RANK"])
print(f"rank {os.environ['RANK']} started on node {node} pid {os.getpid()}", flush=True)
if node == args.node:
    sys.exit(args.code)
time.sleep(args.sleep)
