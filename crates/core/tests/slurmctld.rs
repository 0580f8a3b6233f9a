#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! Our Slurm files judged by a real slurmctld (`e2e/slurm/install.sh` installs them; `make
//! test` runs it first): Debian's 22.05 (`topology.conf`, the tree plugin) on this machine and
//! Debian sid's (26.05 when written: `topology.yaml`, Slinky's dynamic nodes) in a root of its
//! own. For each fleet shape the labels can take, the files the publisher would write (its own
//! `data`) must load, every node must sit in the switch named after its deepest network node,
//! and no bottom switch may mix nodes of different leaves; where the labels give no valid file,
//! the file drawn naively from the same tree must be one slurmctld refuses (so refusing it is
//! right), and a running slurmctld must outlive a reconfigure while we keep the last file.
//!
//! Each test starts its own munged and slurmctld (loopback ports, files in a temp dir), and
//! kills them when done.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ec2_topology_core::{
    labels::{
        CAPACITY_BLOCK_KEY, CAPACITY_BLOCK_SIZE_KEY, LabelScheme, LayerNumbering, SlinkySpec,
        slinky_spec,
    },
    slurm::{self, Files, Problem, data},
    tree::{Domain, Forest, NodeView, path_of},
};

/// Which slurmctld.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slurm {
    /// Debian stable's, on this machine (22.05).
    Host,
    /// Debian sid's, in the root `e2e/slurm/install.sh` builds (26.05 when written).
    Sid,
}

fn cache() -> PathBuf {
    std::env::var_os("EC2TL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/ec2-topology-labeler")
        })
}

fn sid_root() -> PathBuf {
    let root = cache().join("slurm/sid-root");
    assert!(
        root.join("usr/sbin/slurmctld").exists(),
        "no Debian sid root with slurmctld at {}: run e2e/slurm/install.sh (make slurm)",
        root.display()
    );
    root
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One running slurmctld with its own munged, slurm.conf and state, in a temp dir.
struct Ctld {
    slurm: Slurm,
    /// The directory as the daemons see it (inside the sid root for [`Slurm::Sid`]).
    dir: PathBuf,
    /// The same directory on this machine.
    host_dir: PathBuf,
    children: Vec<Child>,
}

impl Ctld {
    /// Starts slurmctld over `files` (name → content) for a cluster of `nodes`; `Err` with its
    /// log when it does not come up (a `fatal`).
    fn start(slurm: Slurm, nodes: &[String], files: &[(&str, &str)]) -> Result<Self, String> {
        let stamp = format!("ec2tl-slurmctld-{}-{:x}", std::process::id(), random());
        let (dir, host_dir) = match slurm {
            Slurm::Host => {
                let d = std::env::temp_dir().join(&stamp);
                (d.clone(), d)
            }
            Slurm::Sid => (
                PathBuf::from("/tmp").join(&stamp),
                sid_root().join("tmp").join(&stamp),
            ),
        };
        for sub in ["state", "spool", "munge", "log"] {
            std::fs::create_dir_all(host_dir.join(sub)).expect("temp dirs");
        }
        let key: Vec<u8> = (0..128).flat_map(|_| random().to_le_bytes()).collect();
        let key_path = host_dir.join("munge/munge.key");
        std::fs::write(&key_path, key).expect("munge key");
        set_mode(&key_path, 0o400);
        set_mode(&host_dir.join("munge"), 0o700);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string();
        let d = dir.display();
        // No static node: Slinky's case, dynamic nodes only (MaxNodeCount makes room for
        // them; with static nodes its free slots would count as nodes under no switch).
        let node_line = if nodes.is_empty() {
            "MaxNodeCount=64\n".to_string()
        } else {
            format!(
                "NodeName={} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\nPartitionName=all Nodes=ALL Default=YES\n",
                nodes.join(",")
            )
        };
        let conf = format!(
            "ClusterName=ec2tl\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={}\nSlurmdPort={}\n\
             AuthType=auth/munge\nAuthInfo=socket={d}/munge/sock\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmUser=root\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmctldDebug=info\nTopologyPlugin=topology/tree\nSelectType=select/cons_tres\n\
             ProctrackType=proctrack/linuxproc\nMpiDefault=none\nMailProg=/bin/true\n\
             AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n{node_line}",
            free_port(),
            free_port(),
        );
        std::fs::write(host_dir.join("slurm.conf"), conf).expect("slurm.conf");
        for (name, content) in files {
            std::fs::write(host_dir.join(name), content).expect("topology file");
        }
        let munged = format!(
            "munged -F -f --socket={d}/munge/sock --key-file={d}/munge/munge.key \
             --log-file={d}/munge/log --pid-file={d}/munge/pid --seed-file={d}/munge/seed"
        );
        let ctld = format!("slurmctld -D -f {d}/slurm.conf");
        let mut me = Self {
            slurm,
            dir,
            host_dir,
            children: Vec::new(),
        };
        match slurm {
            Slurm::Host => {
                me.children.push(spawn_sh(&munged, &me.host_dir));
                me.children.push(spawn_sh(&ctld, &me.host_dir));
            }
            Slurm::Sid => {
                // /proc for slurmctld, in a mount namespace of its own; a PID namespace so
                // that killing `unshare` (--kill-child) ends munged too.
                let root = sid_root();
                let inner = format!("{munged} & exec {ctld}");
                let script = format!(
                    "mount -t proc proc {r}/proc && exec chroot {r} /bin/sh -c '{inner}'",
                    r = root.display()
                );
                let child = Command::new("unshare")
                    .args(["--mount", "--pid", "--fork", "--kill-child", "--"])
                    .args(["/bin/sh", "-c", &script])
                    .stdout(Stdio::null())
                    .stderr(Stdio::from(
                        std::fs::File::create(me.host_dir.join("log/stderr")).expect("log"),
                    ))
                    .spawn()
                    .expect("unshare");
                me.children.push(child);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if !me.alive() {
                return Err(me.log());
            }
            if me
                .scontrol(&["ping"])
                .is_ok_and(|out| out.contains("is UP"))
            {
                return Ok(me);
            }
            if Instant::now() > deadline {
                return Err(format!("slurmctld not up in 30 s\n{}", me.log()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn alive(&mut self) -> bool {
        self.children
            .last_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits up to `within` for slurmctld to exit.
    fn exits_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if !self.alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn log(&self) -> String {
        let read = |p: &str| std::fs::read_to_string(self.host_dir.join(p)).unwrap_or_default();
        format!("{}{}", read("log/slurmctld.log"), read("log/stderr"))
    }

    fn scontrol(&self, args: &[&str]) -> Result<String, String> {
        let conf = self.dir.join("slurm.conf");
        let mut cmd = match self.slurm {
            Slurm::Host => Command::new("timeout"),
            Slurm::Sid => {
                let mut c = Command::new("chroot");
                c.arg(sid_root()).arg("timeout");
                c
            }
        };
        let out = cmd
            .args(["10", "scontrol"])
            .args(args)
            .env("SLURM_CONF", conf)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "{text}{}",
                String::from_utf8_lossy(&out.stderr).into_owned()
            ))
        }
    }

    fn write(&self, name: &str, content: &str) {
        std::fs::write(self.host_dir.join(name), content).expect("write a topology file");
    }

    /// `scontrol show topology`, each switch with its level, its nodes (expanded by Slurm's own
    /// `scontrol show hostnames`) and its child switches.
    fn topology(&self) -> BTreeMap<String, ShownSwitch> {
        let text = self
            .scontrol(&["show", "topology"])
            .unwrap_or_else(|e| panic!("scontrol show topology: {e}\n{}", self.log()));
        let mut out = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("SwitchName=")) {
            let field = |k: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap_or_default()
                    .to_string()
            };
            let nodes = match field("Nodes=") {
                list if list.is_empty() || list == "(null)" => BTreeSet::new(),
                list => self
                    .scontrol(&["show", "hostnames", &list])
                    .expect("scontrol show hostnames")
                    .lines()
                    .map(str::to_string)
                    .collect(),
            };
            let switches = field("Switches=");
            out.insert(
                field("SwitchName="),
                ShownSwitch {
                    level: field("Level=").parse().unwrap_or(usize::MAX),
                    nodes,
                    switches: switches
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                },
            );
        }
        out
    }
}

impl Drop for Ctld {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.host_dir);
    }
}

#[derive(Debug)]
struct ShownSwitch {
    level: usize,
    nodes: BTreeSet<String>,
    switches: Vec<String>,
}

/// Unpredictable enough for temp dir names and a throwaway munge key (xorshift over the clock,
/// the process and a counter).
fn random() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
        ^ (u64::from(std::process::id()) << 32);
    let mut x = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed) ^ seed;
    for _ in 0..3 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn spawn_sh(cmd: &str, dir: &Path) -> Child {
    Command::new("/bin/sh")
        .args(["-c", &format!("exec {cmd}")])
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("log/stderr"))
                .expect("log"),
        ))
        .spawn()
        .expect("spawn")
}

/// A fleet: its nodes as the label scheme reads them.
struct Shape {
    name: &'static str,
    scheme: LabelScheme,
    nodes: Vec<NodeView>,
}

fn node(scheme: &LabelScheme, name: &str, path: &[&str]) -> NodeView {
    NodeView::labelled(name, scheme, path)
}

fn unlabelled(name: &str) -> NodeView {
    NodeView {
        labels: BTreeMap::new(),
        ..NodeView::labelled(name, &LabelScheme::default(), &[])
    }
}

fn eks(i: usize) -> String {
    format!(
        "ip-10-0-{}-{}.us-west-2.compute.internal",
        i / 200,
        i % 200 + 1
    )
}

/// Every shape the labels can take whose files slurmctld must load.
fn loadable_shapes() -> Vec<Shape> {
    let s = LabelScheme::default();
    let leaf_first = LabelScheme {
        numbering: LayerNumbering::LeafFirst,
        ..LabelScheme::default()
    };
    // A 3-layer node padded by --uniform-depth 4 (its deepest network node repeated).
    let padded = node(&s, "p5-padded", &["nn-a", "nn-b", "nn-c", "nn-c"]);
    vec![
        Shape {
            name: "mixed depths: nn-c is the leaf of 3-layer instances and the parent of a 4-layer one's; a second top",
            scheme: s.clone(),
            nodes: vec![
                node(&s, "p5-a", &["nn-a", "nn-b", "nn-c"]),
                node(&s, "p5-b", &["nn-a", "nn-b", "nn-c"]),
                padded,
                node(&s, "b200-a", &["nn-a", "nn-b", "nn-c", "nn-d"]),
                node(&s, "b200-b", &["nn-a", "nn-b", "nn-c", "nn-e"]),
                node(&s, "p5-c", &["nn-a", "nn-f", "nn-g"]),
                node(&s, "two-layer", &["nn-a", "nn-b"]),
                node(&s, "gb200-a", &["nn-t2", "nn-m2", "nn-s2", "nn-l2"]),
                unlabelled("fargate-1"),
            ],
        },
        Shape {
            name: "mixed depths, leaf-first numbering",
            scheme: leaf_first.clone(),
            nodes: vec![
                node(&leaf_first, "p5-a", &["nn-a", "nn-b", "nn-c"]),
                node(&leaf_first, "b200-a", &["nn-a", "nn-b", "nn-c", "nn-d"]),
            ],
        },
        Shape {
            name: "all unlabelled",
            scheme: s.clone(),
            nodes: vec![unlabelled("x-1"), unlabelled("x-2"), unlabelled("x-3")],
        },
        Shape {
            name: "EKS node names, 300 nodes, two tops, 9 leaves",
            scheme: s.clone(),
            nodes: (0..300)
                .map(|i| {
                    let top = format!("nn-top{}", i % 2);
                    let mid = format!("nn-mid{}", i % 2);
                    let leaf = format!("nn-leaf{}", (i % 9) * 2 + i % 2);
                    node(&s, &eks(i), &[&top, &mid, &leaf])
                })
                .collect(),
        },
    ]
}

/// Shapes whose labels give no valid file.
fn refused_shapes() -> Vec<(Shape, &'static str)> {
    let s = LabelScheme::default();
    vec![
        (
            Shape {
                name: "a network node under two parents (labels disagree)",
                scheme: s.clone(),
                nodes: vec![
                    node(&s, "a", &["nn-t", "nn-m1", "nn-l"]),
                    node(&s, "b", &["nn-t", "nn-m2", "nn-l"]),
                ],
            },
            "Switch (nn-l) has already been defined",
        ),
        (
            Shape {
                name: "a network node at two layers",
                scheme: s.clone(),
                nodes: vec![
                    node(&s, "a", &["nn-t", "nn-x", "nn-l"]),
                    node(&s, "b", &["nn-t", "nn-m", "nn-x"]),
                ],
            },
            "Switch (nn-x) has already been defined",
        ),
    ]
}

/// `topology.conf` drawn from the tree without our rules: a switch per network node per place
/// it appears, nodes and children together (what the generator wrote before).
fn naive_conf(forest: &Forest) -> String {
    fn walk(d: &Domain, out: &mut String) {
        for c in d.children.values() {
            walk(c, out);
        }
        out.push_str(&format!("SwitchName={}", d.id));
        if !d.children.is_empty() {
            let names: Vec<&str> = d.children.keys().map(String::as_str).collect();
            out.push_str(&format!(" Switches={}", names.join(",")));
        }
        if !d.nodes.is_empty() {
            let names: Vec<&str> = d.nodes.iter().map(|n| n.name.as_str()).collect();
            out.push_str(&format!(" Nodes={}", names.join(",")));
        }
        out.push('\n');
    }
    let mut out = String::new();
    for d in forest.roots.values() {
        walk(d, &mut out);
    }
    out
}

fn names(nodes: &[NodeView]) -> Vec<String> {
    nodes.iter().map(|n| n.name.clone()).collect()
}

fn tree_files() -> Files {
    Files {
        tree_topology: "topo-switch".into(),
        switches_only: false,
    }
}

/// Every node in the level-0 switch named after its deepest network node (`unlabelled` for
/// those without labels), in exactly one level-0 switch, and every node under one top switch.
fn assert_placed(shape: &Shape, shown: &BTreeMap<String, ShownSwitch>, log: &str) {
    for n in &shape.nodes {
        let want = path_of(&shape.scheme, &n.labels)
            .and_then(|p| p.last().cloned())
            .unwrap_or_else(|| slurm::UNLABELLED.to_string());
        let leaves: Vec<&String> = shown
            .iter()
            .filter(|(_, s)| s.level == 0 && s.nodes.contains(&n.name))
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            leaves,
            vec![&want],
            "{}: {} should sit in leaf switch {want} alone; slurmctld shows {shown:#?}",
            shape.name,
            n.name
        );
    }
    // No bottom switch mixes leaves: every node of a level-0 switch has that switch as its leaf
    // (checked above from the nodes' side; here from the switches').
    for (name, s) in shown.iter().filter(|(_, s)| s.level == 0) {
        for n in &s.nodes {
            assert!(
                shape.nodes.iter().any(|v| &v.name == n),
                "{}: {name} holds {n}, not in the fleet",
                shape.name
            );
        }
    }
    let all: BTreeSet<String> = names(&shape.nodes).into_iter().collect();
    assert!(
        shown.values().any(|s| s.nodes == all),
        "{}: no switch reaches every node: {shown:#?}",
        shape.name
    );
    assert!(
        !log.contains("switches lack access"),
        "{}: slurmctld says some nodes are under no switch:\n{log}",
        shape.name
    );
}

#[test]
fn every_loadable_shape_loads_in_slurmctld_22_05_from_topology_conf() {
    for shape in loadable_shapes() {
        let files = data(&shape.scheme, &tree_files(), &shape.nodes)
            .unwrap_or_else(|p| panic!("{}: {p:?}", shape.name));
        let conf = &files
            .iter()
            .find(|(k, _)| k == "topology.conf")
            .expect("conf")
            .1;
        let ctld = Ctld::start(
            Slurm::Host,
            &names(&shape.nodes),
            &[("topology.conf", conf)],
        )
        .unwrap_or_else(|log| panic!("{}: slurmctld refused\n{conf}\n{log}", shape.name));
        let shown = ctld.topology();
        println!(
            "== {} (22.05, topology.conf)\n{}",
            shape.name,
            ctld.scontrol(&["show", "topology"]).unwrap_or_default()
        );
        assert_placed(&shape, &shown, &ctld.log());
    }
}

#[test]
fn every_loadable_shape_loads_in_slurmctld_26_05_from_topology_yaml_and_conf() {
    for shape in loadable_shapes() {
        let files = data(&shape.scheme, &tree_files(), &shape.nodes)
            .unwrap_or_else(|p| panic!("{}: {p:?}", shape.name));
        for (file, content) in &files {
            let ctld = Ctld::start(Slurm::Sid, &names(&shape.nodes), &[(file, content)])
                .unwrap_or_else(|log| {
                    panic!("{}: slurmctld refused {file}\n{content}\n{log}", shape.name)
                });
            let shown = ctld.topology();
            println!(
                "== {} (sid, {file})\n{}",
                shape.name,
                ctld.scontrol(&["show", "topology"]).unwrap_or_default()
            );
            assert_placed(&shape, &shown, &ctld.log());
        }
    }
}

#[test]
fn refused_shapes_give_no_file_and_their_naive_file_stops_slurmctld() {
    for (shape, fatal) in refused_shapes() {
        let got = data(&shape.scheme, &tree_files(), &shape.nodes);
        assert!(got.is_err(), "{}: {got:?}", shape.name);
        let naive = naive_conf(&Forest::build(&shape.scheme, &shape.nodes));
        for slurm in [Slurm::Host, Slurm::Sid] {
            match Ctld::start(slurm, &names(&shape.nodes), &[("topology.conf", &naive)]) {
                Ok(_) => panic!("{}: {slurm:?} took the naive file\n{naive}", shape.name),
                Err(log) => assert!(log.contains(fatal), "{}: {slurm:?}\n{log}", shape.name),
            }
        }
    }
}

#[test]
fn an_empty_fleet_gets_a_topology_yaml_slurmctld_26_05_loads_and_no_topology_conf() {
    let files = data(&LabelScheme::default(), &tree_files(), &[]);
    assert_eq!(
        files,
        Err(vec![Problem::NoSwitch]),
        "no topology.conf for an empty fleet"
    );
    // What each Slurm makes of a topology.conf without a switch: 26.05 stops.
    let none = "# no switch\n";
    let err = Ctld::start(Slurm::Sid, &[], &[("topology.conf", none)]).err();
    assert!(
        err.as_deref()
            .is_some_and(|l| l.contains("No switches configured")),
        "{err:?}"
    );
    let forest = Forest::default();
    let yaml = slurm::topology_yaml(&forest, "topo-switch", &Default::default()).expect("yaml");
    let ctld = Ctld::start(Slurm::Sid, &["n1".into()], &[("topology.yaml", &yaml)])
        .unwrap_or_else(|log| panic!("26.05 refused\n{yaml}\n{log}"));
    assert!(ctld.topology().contains_key(slurm::ROOT));
}

#[test]
fn a_reconfigure_reads_the_changed_file_and_survives_refused_labels() {
    for slurm in [Slurm::Host, Slurm::Sid] {
        let s = LabelScheme::default();
        let (file, pick) = match slurm {
            Slurm::Host => ("topology.conf", 1),
            Slurm::Sid => ("topology.yaml", 0),
        };
        let before = vec![
            node(&s, "n1", &["nn-a", "nn-b", "nn-c"]),
            node(&s, "n2", &["nn-a", "nn-b", "nn-c"]),
            node(&s, "n3", &["nn-a", "nn-b", "nn-d"]),
        ];
        // n2 moved (a stop and start) under nn-d, n3 is now a 4-layer instance under nn-c.
        let after = vec![
            node(&s, "n1", &["nn-a", "nn-b", "nn-c"]),
            node(&s, "n2", &["nn-a", "nn-b", "nn-d"]),
            node(&s, "n3", &["nn-a", "nn-b", "nn-c", "nn-e"]),
        ];
        let render = |nodes: &[NodeView]| {
            data(&s, &tree_files(), nodes).expect("valid labels")[pick]
                .1
                .clone()
        };
        let all = names(&before);
        let mut ctld = Ctld::start(slurm, &all, &[(file, &render(&before))])
            .unwrap_or_else(|log| panic!("{slurm:?}: {log}"));
        assert_eq!(
            ctld.topology()["nn-c"].nodes,
            BTreeSet::from(["n1".to_string(), "n2".to_string()])
        );
        // The recipe: the file changes (kubelet refreshes a projected ConfigMap), then
        // `scontrol reconfigure` (Slinky's reconfigure sidecar runs it on any change).
        ctld.write(file, &render(&after));
        ctld.scontrol(&["reconfigure"])
            .expect("scontrol reconfigure");
        let shown = ctld.topology();
        println!(
            "== reconfigured ({slurm:?}, {file})\n{}",
            ctld.scontrol(&["show", "topology"]).unwrap_or_default()
        );
        assert_eq!(shown["nn-c"].nodes, BTreeSet::from(["n1".to_string()]));
        assert_eq!(shown["nn-d"].nodes, BTreeSet::from(["n2".to_string()]));
        assert_eq!(shown["nn-e"].nodes, BTreeSet::from(["n3".to_string()]));
        assert_eq!(shown["nn-c+"].switches, vec!["nn-c", "nn-e"]);
        // Labels that disagree: no new file, the last one stays, slurmctld reconfigures fine.
        let refused = vec![
            node(&s, "n1", &["nn-a", "nn-b", "nn-c"]),
            node(&s, "n2", &["nn-a", "nn-x", "nn-c"]),
        ];
        assert!(data(&s, &tree_files(), &refused).is_err());
        ctld.scontrol(&["reconfigure"])
            .expect("scontrol reconfigure");
        assert!(ctld.alive(), "{}", ctld.log());
        assert_eq!(
            ctld.topology()["nn-d"].nodes,
            BTreeSet::from(["n2".to_string()])
        );
        // The file those labels would naively give stops a running slurmctld on reconfigure.
        ctld.write("topology.conf", &naive_conf(&Forest::build(&s, &refused)));
        if slurm == Slurm::Sid {
            // 26.05 reads topology.yaml first: take it away so that it reads topology.conf.
            let _ = std::fs::remove_file(ctld.host_dir.join("topology.yaml"));
        }
        let _ = ctld.scontrol(&["reconfigure"]);
        assert!(
            ctld.exits_within(Duration::from_secs(10)),
            "{slurm:?}: slurmctld outlived a file it refuses"
        );
        assert!(
            ctld.log().contains("has already been defined"),
            "{}",
            ctld.log()
        );
    }
}

#[test]
fn slinky_names_exist_in_the_switches_only_topology_yaml_and_place_dynamic_nodes() {
    let s = LabelScheme {
        slinky: Some(SlinkySpec {
            tree_topology: "topo-switch".into(),
            block_topology: Some("topo-block".into()),
        }),
        ..LabelScheme::default()
    };
    let mut nodes = vec![
        node(&s, "p5-a", &["nn-a", "nn-b", "nn-c"]),
        node(&s, "p5-b", &["nn-a", "nn-b", "nn-c"]),
        node(&s, "b200-a", &["nn-a", "nn-b", "nn-c", "nn-d"]),
        node(&s, "gb200-a", &["nn-a", "nn-g", "nn-h", "nn-i"]),
        node(&s, "gb200-b", &["nn-a", "nn-g", "nn-h", "nn-i"]),
        unlabelled("cpu-1"),
    ];
    for n in nodes.iter_mut().filter(|n| n.name.starts_with("gb200")) {
        n.labels
            .insert(CAPACITY_BLOCK_KEY.into(), "cr-0123456789abcdef0".into());
        // `--ultraserver-shape`: the block's instances as EC2 counts them, 2 of which joined.
        n.labels.insert(CAPACITY_BLOCK_SIZE_KEY.into(), "18".into());
    }
    let files = Files {
        tree_topology: "topo-switch".into(),
        switches_only: true,
    };
    let data = data(&s, &files, &nodes).expect("valid labels");
    assert_eq!(data.len(), 1, "topology.yaml alone: {data:?}");
    let yaml = &data[0].1;
    // The base block size is the UltraServer's, not the 2 nodes that joined it so far.
    assert!(yaml.contains("    block_sizes: [18]\n"), "{yaml}");
    let Some(slinky) = &s.slinky else {
        unreachable!()
    };
    // Slurm node names are pod names in Slinky: none is in slurm.conf, each joins as a dynamic
    // node with the topology its Kubernetes node's annotation names (what slurm-operator does).
    let mut ctld = Ctld::start(Slurm::Sid, &[], &[("topology.yaml", yaml)])
        .unwrap_or_else(|log| panic!("slurmctld refused\n{yaml}\n{log}"));
    let mut placed = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let Some(spec) = slinky_spec(&s, slinky, &n.labels) else {
            assert!(n.labels.is_empty(), "{}: no annotation", n.name);
            continue;
        };
        for pair in spec.split(',') {
            let (topology, name) = pair.split_once(':').expect("topology:name");
            let line = match topology {
                "topo-switch" => format!("      - switch: {name}\n"),
                _ => format!("      - block: {name}\n"),
            };
            assert!(yaml.contains(&line), "{pair} not in\n{yaml}");
        }
        let pod = format!("slinky-{i}");
        ctld.scontrol(&[
            "create",
            &format!("NodeName={pod}"),
            "CPUs=1",
            "State=FUTURE",
            &format!("Topology={spec}"),
        ])
        .unwrap_or_else(|e| panic!("{}: Topology={spec} refused: {e}\n{yaml}", n.name));
        let leaf = path_of(&s, &n.labels).and_then(|p| p.last().cloned());
        placed.insert(pod, leaf.expect("a labelled node"));
    }
    let shown = ctld.topology();
    println!(
        "== Slinky, switches only (sid)\n{yaml}\n{}",
        ctld.scontrol(&["show", "topology"]).unwrap_or_default()
    );
    for (pod, leaf) in &placed {
        assert!(
            shown[leaf].level == 0 && shown[leaf].nodes.contains(pod),
            "{pod} not in leaf {leaf}: {shown:#?}"
        );
    }
    // A name missing from topology.yaml is refused: the annotation must only name ours.
    let refused = ctld.scontrol(&[
        "create",
        "NodeName=stray",
        "CPUs=1",
        "State=FUTURE",
        "Topology=topo-switch:nn-elsewhere",
    ]);
    assert!(refused.is_err(), "{refused:?}");
    assert!(ctld.alive());
    let _ = std::io::stdout().flush();
}
