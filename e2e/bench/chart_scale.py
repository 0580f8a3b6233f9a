"""Controller RSS and EC2 calls against the number of nodes (make bench-scale)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = []
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        rows.append(row)
rows.sort(key=lambda r: int(r["nodes"]))
# One curve per build (the first in the file is what ships); calls are the first build's.
builds = list(dict.fromkeys(r.get("build", "") for r in rows))
first = [r for r in rows if r.get("build", "") == builds[0]]
nodes = [int(r["nodes"]) for r in first]
idle = [float(r["idle_rss_mib"]) for r in first]
calls = [int(r["ec2_calls"]) for r in first]

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120)
for b in builds:
    mine = [r for r in rows if r.get("build", "") == b]
    name = f"peak RSS, {b} build" if b else "controller peak RSS"
    left.plot([int(r["nodes"]) for r in mine], [float(r["peak_rss_mib"]) for r in mine], marker="o", linewidth=2, label=name)
left.plot(nodes, idle, linestyle="--", label="idle controller")
left.plot(nodes, [i + n * 1.5 / 1024 for i, n in zip(idle, nodes)], linestyle=":", label="target: idle + 1.5 KiB/node")
left.set_xlabel("nodes")
left.set_ylabel("MiB")
left.set_title("Memory")
left.grid(True, alpha=0.3)
left.legend(loc="upper left")
right.plot(nodes, calls, marker="o", linewidth=2, label="ours: EC2 calls to label all")
right.plot(nodes, [(n + 99) // 100 for n in nodes], linestyle=":", label="floor: ceil(N/100)")
right.plot(nodes, nodes, linestyle="--", label="one call per node (EKS)")
right.set_xscale("log")
right.set_yscale("log")
right.set_xlabel("nodes")
right.set_ylabel("DescribeInstanceTopology calls")
right.set_title("EC2 calls")
right.grid(True, alpha=0.3)
right.legend(loc="upper left")
fig.suptitle("ec2-topology-labeler at scale: install into an existing cluster")
fig.tight_layout()
fig.savefig(sys.argv[2])
print(f"wrote {sys.argv[2]}")
