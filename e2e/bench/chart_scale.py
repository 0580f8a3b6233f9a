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
nodes = [int(r["nodes"]) for r in rows]
rss = [float(r["peak_rss_mib"]) for r in rows]
idle = [float(r["idle_rss_mib"]) for r in rows]
calls = [int(r["ec2_calls"]) for r in rows]

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120)
left.plot(nodes, rss, marker="o", linewidth=2, label="controller peak RSS")
left.plot(nodes, idle, linestyle="--", label="idle controller")
left.plot(nodes, [i + n * 2 / 1024 for i, n in zip(idle, nodes)], linestyle=":", label="target: idle + 2 KiB/node")
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
