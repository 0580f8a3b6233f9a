"""Labelled nodes over time: the controller at each fleet size vs the article's script."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

series = {}
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        series.setdefault(row["series"], []).append((float(row["seconds"]), int(row["labelled"])))

fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
for name, points in sorted(series.items()):
    points.sort()
    xs = [0.0] + [p[0] for p in points]
    ys = [0] + [p[1] for p in points]
    label = name.replace("ours-", "ec2-topology-labeler, N=").replace("baseline-script", "article's script (aws + jq + kubectl label)")
    ax.step(xs, ys, where="post", label=label, linewidth=2)
ax.set_xscale("symlog", linthresh=10)
ax.set_xlabel("seconds since the nodes were created (log scale past 10 s)")
ax.set_ylabel("nodes with topology labels")
ax.set_title("Labelling a fleet: real kube-apiserver, EC2-like mock (50 ms, 100 burst, 20/s)")
ax.grid(True, alpha=0.3)
ax.legend(loc="lower right")
fig.tight_layout()
fig.savefig(sys.argv[2])
print(f"wrote {sys.argv[2]}")
