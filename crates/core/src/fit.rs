//! Where a gang fits: the topology domains at one level (the values of one node label) that can
//! take all of a gang's pods now, from each node's allocatable resources and the requests of the
//! pods bound to it, best first; and for those that cannot, how close they come and what runs
//! out. What `ec2-topology-labeler fit` prints. Pure: nothing here does I/O.
//!
//! A node takes `min over requested resources of floor(free / per-pod request)` pods of the
//! gang, and no more than its free pod slots (`pods` allocatable less the pods bound to it). A
//! node that is cordoned, not Ready, or tainted `NoSchedule`/`NoExecute` with a taint the gang
//! does not tolerate takes none; a node the gang's node selector leaves out, or without the
//! level's label, is in no domain. Domains that fit come tightest first (fewest pod
//! slots to spare, as Kueue's BestFit picks), misses nearest first.

use std::collections::BTreeMap;

use serde::Serialize;

/// Resource amounts in thousandths of their unit (`cpu: 500m` is 500, `nvidia.com/gpu: 8` is
/// 8,000), as Kubernetes' `MilliValue` gives them.
pub type Milli = i128;

/// The pod-slot resource every pod takes one of.
pub const PODS: &str = "pods";

/// A Kubernetes quantity that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a Kubernetes quantity (a number with an optional suffix: 500m, 8, 64Gi, 1e3)"
)]
pub struct QuantityError(pub String);

/// A Kubernetes quantity (`128974848`, `129e6`, `129M`, `123Mi`, `500m`, `.5`) in thousandths,
/// rounded up as Kubernetes' `MilliValue` rounds.
pub fn milli(text: &str) -> Result<Milli, QuantityError> {
    let bad = || QuantityError(text.to_string());
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.len() + fraction.len() == 0 || fraction.contains('.') || number.len() > 30 {
        return Err(bad());
    }
    let digits: i128 = format!("{whole}{fraction}").parse().map_err(|_| bad())?;
    // value = digits / 10^fraction × 2^binary × 10^decimal; in thousandths, × 10^3.
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .filter(|e| !e.is_empty() && e.len() <= 3)
                .and_then(|e| e.parse::<i32>().ok())
                .filter(|e| (-30..=30).contains(e))
                .ok_or_else(bad)?;
            (0, exponent)
        }
    };
    let scale = decimal + 3 - i32::try_from(fraction.len()).map_err(|_| bad())?;
    let ten = |n: i32| 10_i128.checked_pow(n.unsigned_abs());
    let numerator = digits
        .checked_mul(1_i128 << binary)
        .and_then(|n| n.checked_mul(if scale > 0 { ten(scale)? } else { 1 }))
        .ok_or_else(bad)?;
    let denominator = if scale < 0 {
        ten(scale).ok_or_else(bad)?
    } else {
        1
    };
    // Up toward +infinity, as MilliValue does.
    Ok(if negative {
        -(numerator / denominator)
    } else {
        numerator.div_euclid(denominator) + i128::from(numerator % denominator != 0)
    })
}

/// Thousandths back as a short quantity for people: `8`, `500m`, `64Gi` (binary when whole
/// gibibytes or mebibytes, else decimal).
pub fn show(m: Milli) -> String {
    if m % 1000 != 0 {
        return format!("{m}m");
    }
    let units = m / 1000;
    for (shift, suffix) in [(40, "Ti"), (30, "Gi"), (20, "Mi")] {
        let size = 1_i128 << shift;
        if units != 0 && units % size == 0 {
            return format!("{}{suffix}", units / size);
        }
    }
    units.to_string()
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    /// Whether it keeps pods that do not tolerate it off the node.
    pub fn repels(&self) -> bool {
        matches!(self.effect.as_str(), "NoSchedule" | "NoExecute")
    }
}

/// A pod toleration, as the pod spec writes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Toleration {
    /// Empty or absent with `Exists`: every key.
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    pub operator: Option<String>,
    pub value: Option<String>,
    /// Empty or absent: every effect.
    pub effect: Option<String>,
}

impl Toleration {
    /// Whether it tolerates `taint`, as Kubernetes decides (`ToleratesTaint`).
    pub fn tolerates(&self, taint: &Taint) -> bool {
        fn set(s: &Option<String>) -> Option<&str> {
            s.as_deref().filter(|s| !s.is_empty())
        }
        if set(&self.effect).is_some_and(|e| e != taint.effect) {
            return false;
        }
        if set(&self.key).is_some_and(|k| k != taint.key) {
            return false;
        }
        match set(&self.operator).unwrap_or("Equal") {
            "Exists" => true,
            "Equal" => {
                set(&self.key).is_some()
                    && self.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            _ => false,
        }
    }
}

/// What `fit` needs of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capacity {
    pub name: String,
    /// Its value of the level's label; `None`: in no domain.
    pub domain: Option<String>,
    /// `status.allocatable`, in thousandths.
    pub allocatable: BTreeMap<String, Milli>,
    /// The requests of the pods bound to it (not finished), summed, with [`PODS`] their count.
    pub requested: BTreeMap<String, Milli>,
    /// Ready and not cordoned.
    pub schedulable: bool,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Its labels, for the gang's node selector.
    pub labels: BTreeMap<String, String>,
}

/// A gang: `pods` pods, each requesting `requests` (in thousandths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    pub pods: u64,
    pub requests: BTreeMap<String, Milli>,
    /// Node labels each pod requires (its `nodeSelector`).
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

impl Gang {
    /// `pods` pods of `requests` each, on any node, tolerating nothing.
    pub fn new(pods: u64, requests: BTreeMap<String, Milli>) -> Self {
        Gang {
            pods,
            requests,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
        }
    }

    /// Whether its node selector takes `node`.
    pub fn selects(&self, node: &Capacity) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v))
    }

    /// Whether it tolerates every taint of `node` that repels pods.
    pub fn tolerates(&self, node: &Capacity) -> bool {
        node.taints
            .iter()
            .filter(|t| t.repels())
            .all(|t| self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }
}

impl Capacity {
    /// Free amount of `resource` (allocatable less requested; never below 0).
    pub fn free(&self, resource: &str) -> Milli {
        let have = self.allocatable.get(resource).copied().unwrap_or(0);
        (have - self.requested.get(resource).copied().unwrap_or(0)).max(0)
    }

    /// Pods of `gang` this node takes, and the resource that stops it taking more (`None` when
    /// it is not schedulable).
    pub fn takes(&self, gang: &Gang) -> (u64, Option<String>) {
        if !self.schedulable || !gang.tolerates(self) {
            return (0, None);
        }
        let slots = self.free(PODS) / 1000;
        let mut best = (u64::try_from(slots).unwrap_or(0), Some(PODS.to_string()));
        for (resource, each) in &gang.requests {
            if *each <= 0 || resource == PODS {
                continue;
            }
            let n = u64::try_from(self.free(resource) / each).unwrap_or(0);
            if n < best.0 {
                best = (n, Some(resource.clone()));
            }
        }
        best
    }
}

/// One domain at the level, as the gang sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    /// The level label's value.
    pub name: String,
    pub nodes: u64,
    /// Of those, how many can take a pod of the gang at all.
    pub usable_nodes: u64,
    /// Pods of the gang it can take now: its whole room, which may be more than the gang.
    pub takes: u64,
    /// The gang's pods it cannot place (0 when it fits).
    pub short: u64,
    /// Free amount of each resource the gang requests (and pod slots), summed over its
    /// schedulable nodes, shown as quantities.
    pub free: BTreeMap<String, String>,
    /// Nodes whose room for the gang ends at each resource (why it is short), most first.
    pub limited_by: Vec<(String, u64)>,
    /// Nodes that take no pod of this gang whatever their room (cordoned, not Ready, a taint
    /// it does not tolerate).
    pub unschedulable: u64,
}

/// Where a gang fits at one level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    pub pods: u64,
    /// Per pod, shown as quantities.
    pub requests: BTreeMap<String, String>,
    /// Domains that take the whole gang, tightest first (fewest pods to spare), then by name.
    pub fits: Vec<Domain>,
    /// Domains that do not, nearest first (most pods taken), then by name.
    pub misses: Vec<Domain>,
    /// Nodes the gang's selector takes without the level's label (in no domain).
    pub unlabelled: u64,
}

/// Where `gang` fits among `nodes`, by their domain at the level.
pub fn fit(nodes: &[Capacity], gang: &Gang) -> Answer {
    let mut by_domain: BTreeMap<&str, Vec<&Capacity>> = BTreeMap::new();
    let mut unlabelled = 0;
    for n in nodes.iter().filter(|n| gang.selects(n)) {
        match n.domain.as_deref() {
            Some(d) => by_domain.entry(d).or_default().push(n),
            None => unlabelled += 1,
        }
    }
    let mut fits = Vec::new();
    let mut misses = Vec::new();
    for (name, members) in by_domain {
        let mut takes = 0u64;
        let mut usable = 0u64;
        let mut unschedulable = 0u64;
        let mut limited: BTreeMap<String, u64> = BTreeMap::new();
        let mut free: BTreeMap<String, Milli> = BTreeMap::new();
        for n in &members {
            let (k, limit) = n.takes(gang);
            takes = takes.saturating_add(k);
            usable += u64::from(k > 0);
            match limit {
                None => unschedulable += 1,
                Some(r) => {
                    *limited.entry(r).or_default() += 1;
                    for r in gang.requests.keys().chain([&PODS.to_string()]) {
                        *free.entry(r.clone()).or_default() += n.free(r);
                    }
                }
            }
        }
        let mut limited_by: Vec<(String, u64)> = limited.into_iter().collect();
        limited_by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let free = free
            .into_iter()
            .map(|(r, m)| {
                let shown = if r == PODS {
                    (m / 1000).to_string()
                } else {
                    show(m)
                };
                (r, shown)
            })
            .collect();
        let d = Domain {
            name: name.to_string(),
            nodes: members.len() as u64,
            usable_nodes: usable,
            takes,
            short: gang.pods.saturating_sub(takes),
            free,
            limited_by,
            unschedulable,
        };
        if d.short == 0 {
            fits.push(d);
        } else {
            misses.push(d);
        }
    }
    fits.sort_by(|a, b| a.takes.cmp(&b.takes).then_with(|| a.name.cmp(&b.name)));
    misses.sort_by(|a, b| b.takes.cmp(&a.takes).then_with(|| a.name.cmp(&b.name)));
    Answer {
        pods: gang.pods,
        requests: gang
            .requests
            .iter()
            .map(|(r, m)| (r.clone(), show(*m)))
            .collect(),
        fits,
        misses,
        unlabelled,
    }
}

impl Answer {
    /// The text `fit` prints: a summary line, then each domain that fits, then the nearest
    /// `misses` misses with what runs out.
    pub fn render(&self, level: &str, misses: usize) -> String {
        use std::fmt::Write;
        let per_pod: Vec<String> = self
            .requests
            .iter()
            .map(|(r, q)| format!("{r}={q}"))
            .collect();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "gang: {} pod(s) of {}; level {level}: {} domain(s) fit, {} do not{}",
            self.pods,
            if per_pod.is_empty() {
                "(no requests)".to_string()
            } else {
                per_pod.join(",")
            },
            self.fits.len(),
            self.misses.len(),
            if self.unlabelled > 0 {
                format!(" ({} node(s) without the label)", self.unlabelled)
            } else {
                String::new()
            }
        );
        for d in &self.fits {
            let _ = writeln!(
                s,
                "FITS  {}  takes {} of {} ({} to spare) on {} of {} node(s)  free {}",
                d.name,
                self.pods,
                self.pods,
                d.takes - self.pods,
                d.usable_nodes,
                d.nodes,
                free_text(d)
            );
        }
        for d in self.misses.iter().take(misses) {
            let limits: Vec<String> = d
                .limited_by
                .iter()
                .map(|(r, n)| format!("{r} on {n} node(s)"))
                .collect();
            let mut why = limits.join(", ");
            if d.unschedulable > 0 {
                if !why.is_empty() {
                    why.push_str(", ");
                }
                let _ = write!(why, "{} node(s) unschedulable", d.unschedulable);
            }
            let _ = writeln!(
                s,
                "MISS  {}  takes {} of {} (short {}) on {} of {} node(s)  free {}  runs out: {why}",
                d.name,
                d.takes,
                self.pods,
                d.short,
                d.usable_nodes,
                d.nodes,
                free_text(d)
            );
        }
        if self.misses.len() > misses {
            let _ = writeln!(s, "({} more that do not fit)", self.misses.len() - misses);
        }
        s
    }
}

fn free_text(d: &Domain) -> String {
    let parts: Vec<String> = d.free.iter().map(|(r, q)| format!("{r}={q}")).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_reads_them() {
        for (text, want) in [
            ("1", 1_000),
            ("500m", 500),
            ("0.5", 500),
            (".5", 500),
            ("5.", 5_000),
            ("+2", 2_000),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("64Gi", 64 * (1 << 30) * 1000),
            ("129M", 129_000_000_000),
            ("129e6", 129_000_000_000),
            ("1E3", 1_000_000),
            ("128974848", 128_974_848_000),
            ("1.5Gi", 1_610_612_736_000),
            ("1n", 1),
            ("1u", 1),
            ("1500u", 2),
            ("-1", -1_000),
            ("1e-3", 1),
        ] {
            assert_eq!(milli(text), Ok(want), "{text}");
        }
        for text in [
            "", "m", "Mi", "1x", "1..2", "1.2.3", "--1", "1e", "1e99", "1 Gi", " 1",
        ] {
            assert!(milli(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn quantities_show_short() {
        assert_eq!(show(8_000), "8");
        assert_eq!(show(500), "500m");
        assert_eq!(show(64 * (1 << 30) * 1000), "64Gi");
        assert_eq!(show(3 * (1 << 20) * 1000), "3Mi");
        assert_eq!(show(0), "0");
    }

    fn node(name: &str, domain: Option<&str>, gpus: i128, used: i128) -> Capacity {
        Capacity {
            name: name.into(),
            domain: domain.map(str::to_string),
            allocatable: [
                ("nvidia.com/gpu".to_string(), gpus * 1000),
                ("cpu".to_string(), 192_000),
                (PODS.to_string(), 110_000),
            ]
            .into(),
            requested: [
                ("nvidia.com/gpu".to_string(), used * 1000),
                (PODS.to_string(), if used > 0 { 1000 } else { 0 }),
            ]
            .into(),
            schedulable: true,
            ..Capacity::default()
        }
    }

    fn gang(pods: u64, gpus: i128) -> Gang {
        Gang::new(pods, [("nvidia.com/gpu".to_string(), gpus * 1000)].into())
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(str::to_string),
            effect: effect.into(),
        }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Toleration {
            key: some(key),
            operator: some(operator),
            value: some(value),
            effect: some(effect),
        }
    }

    #[test]
    fn tolerations_match_as_kubernetes_matches_them() {
        let gpu = taint("nvidia.com/gpu", Some("true"), "NoSchedule");
        for (t, want) in [
            (toleration("nvidia.com/gpu", "Exists", "", ""), true),
            (
                toleration("nvidia.com/gpu", "Equal", "true", "NoSchedule"),
                true,
            ),
            (toleration("nvidia.com/gpu", "", "true", ""), true),
            (toleration("nvidia.com/gpu", "Equal", "false", ""), false),
            (
                toleration("nvidia.com/gpu", "Exists", "", "NoExecute"),
                false,
            ),
            (toleration("", "Exists", "", ""), true),
            (toleration("", "Exists", "", "NoSchedule"), true),
            (toleration("", "Equal", "true", ""), false),
            (toleration("other", "Exists", "", ""), false),
            (toleration("nvidia.com/gpu", "Lt", "5", ""), false),
        ] {
            assert_eq!(t.tolerates(&gpu), want, "{t:?}");
        }
        let bare = taint("dedicated", None, "NoExecute");
        assert!(toleration("dedicated", "Equal", "", "").tolerates(&bare));
    }

    #[test]
    fn a_gang_skips_nodes_its_selector_leaves_out_and_taints_it_does_not_tolerate() {
        let mut tainted = node("t", Some("d"), 8, 0);
        tainted.taints = vec![
            taint("gpu", None, "NoSchedule"),
            taint("soft", None, "PreferNoSchedule"),
        ];
        let mut g = gang(1, 8);
        assert_eq!(tainted.takes(&g), (0, None));
        g.tolerations = vec![toleration("gpu", "Exists", "", "")];
        assert_eq!(tainted.takes(&g).0, 1, "PreferNoSchedule does not repel");
        let mut other = node("o", Some("d"), 8, 0);
        other.labels.insert("pool".into(), "b".into());
        tainted.labels.insert("pool".into(), "a".into());
        g.node_selector.insert("pool".into(), "a".into());
        let a = fit(&[tainted, other], &g);
        assert_eq!(a.fits[0].nodes, 1, "the other pool's node is in no domain");
    }

    #[test]
    fn a_node_takes_what_its_scarcest_resource_and_pod_slots_allow() {
        let n = node("a", Some("d"), 8, 2);
        assert_eq!(n.takes(&gang(1, 2)), (3, Some("nvidia.com/gpu".into())));
        assert_eq!(n.takes(&gang(1, 0)).0, 109, "only pod slots");
        let mut full = node("b", Some("d"), 8, 0);
        full.requested.insert(PODS.into(), 110_000);
        assert_eq!(full.takes(&gang(1, 1)), (0, Some(PODS.into())));
        let mut cordoned = node("c", Some("d"), 8, 0);
        cordoned.schedulable = false;
        assert_eq!(cordoned.takes(&gang(1, 1)), (0, None));
        let mut gang = gang(1, 1);
        gang.requests.insert("example.com/fpga".into(), 1000);
        assert_eq!(
            node("e", Some("d"), 8, 0).takes(&gang),
            (0, Some("example.com/fpga".into())),
            "a resource the node lacks"
        );
    }

    #[test]
    fn domains_that_fit_come_tightest_first_and_misses_nearest_first() {
        let nodes = vec![
            // d1: 4 nodes with 8 free GPUs: takes 4 pods of 8 GPUs.
            node("a1", Some("d1"), 8, 0),
            node("a2", Some("d1"), 8, 0),
            node("a3", Some("d1"), 8, 0),
            node("a4", Some("d1"), 8, 0),
            // d2: exactly 2.
            node("b1", Some("d2"), 8, 0),
            node("b2", Some("d2"), 8, 0),
            // d3: 16 free GPUs, but 4 on each node: no pod of 8 fits.
            node("c1", Some("d3"), 8, 4),
            node("c2", Some("d3"), 8, 4),
            node("c3", Some("d3"), 8, 4),
            node("c4", Some("d3"), 8, 4),
            // d4: one of two cordoned.
            node("e1", Some("d4"), 8, 0),
            Capacity {
                schedulable: false,
                ..node("e2", Some("d4"), 8, 0)
            },
            node("u1", None, 8, 0),
        ];
        let a = fit(&nodes, &gang(2, 8));
        let names = |ds: &[Domain]| ds.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a.fits), ["d2", "d1"], "tightest first");
        assert_eq!(names(&a.misses), ["d4", "d3"], "nearest first");
        assert_eq!(a.unlabelled, 1);
        let d3 = &a.misses[1];
        assert_eq!((d3.takes, d3.short), (0, 2));
        assert_eq!(
            d3.free.get("nvidia.com/gpu").map(String::as_str),
            Some("16")
        );
        assert_eq!(d3.limited_by, [("nvidia.com/gpu".to_string(), 4)]);
        let d4 = &a.misses[0];
        assert_eq!((d4.takes, d4.short, d4.unschedulable), (1, 1, 1));
        let text = a.render("topology.k8s.aws/network-node-layer-3", 5);
        assert_eq!(
            text,
            "gang: 2 pod(s) of nvidia.com/gpu=8; level topology.k8s.aws/network-node-layer-3: 2 domain(s) fit, 2 do not (1 node(s) without the label)\n\
             FITS  d2  takes 2 of 2 (0 to spare) on 2 of 2 node(s)  free nvidia.com/gpu=16,pods=220\n\
             FITS  d1  takes 2 of 2 (2 to spare) on 4 of 4 node(s)  free nvidia.com/gpu=32,pods=440\n\
             MISS  d4  takes 1 of 2 (short 1) on 1 of 2 node(s)  free nvidia.com/gpu=8,pods=110  runs out: nvidia.com/gpu on 1 node(s), 1 node(s) unschedulable\n\
             MISS  d3  takes 0 of 2 (short 2) on 0 of 4 node(s)  free nvidia.com/gpu=16,pods=436  runs out: nvidia.com/gpu on 4 node(s)\n"
        );
        assert_eq!(
            a.render("x", 1).lines().last(),
            Some("(1 more that do not fit)")
        );
    }
}
