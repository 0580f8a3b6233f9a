//! Reserved capacity by network node: each Capacity Reservation where EC2 places it
//! (`DescribeCapacityReservationTopology` gives its network nodes before any instance runs),
//! how many instances it holds (`DescribeCapacityReservations`), and the nodes that joined the
//! cluster from it (matched by the label Karpenter sets, [`RESERVATION_LABEL`]). What
//! `tree --reservations` prints and the reserved-capacity metrics count. Pure: nothing here
//! does I/O.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

/// The node label Karpenter sets on a node launched into a Capacity Reservation.
pub const RESERVATION_LABEL: &str = "karpenter.k8s.aws/capacity-reservation-id";

/// One Capacity Reservation, as EC2 describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub id: String,
    pub instance_type: Option<String>,
    /// As EC2 says it: `active`, `pending`, `expired`, `cancelled`, …
    pub state: Option<String>,
    pub availability_zone: Option<String>,
    /// Set for UltraServer reservations: the UltraServer domain.
    pub capacity_block_id: Option<String>,
    pub group_name: Option<String>,
    /// Top of the hierarchy first. Empty when EC2 gives none: the instance type is not
    /// supported, or the reservation is neither `active` nor `pending`.
    #[serde(default)]
    pub network_nodes: Vec<String>,
    /// Instances it reserves (`totalInstanceCount`), when known.
    pub total: Option<u32>,
    /// Of those, how many no instance uses (`availableInstanceCount`), when known.
    pub available: Option<u32>,
    /// When it started (`startDate`), when known; RFC 3339 in JSON.
    #[serde(default, with = "rfc3339")]
    pub start: Option<SystemTime>,
}

/// An optional [`SystemTime`] as RFC 3339 text (seconds, UTC).
mod rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(&humantime::format_rfc3339_seconds(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| humantime::parse_rfc3339_weak(&t).map_err(D::Error::custom))
            .transpose()
    }
}

impl Reservation {
    /// Instances running in it (joined to this cluster or not), when known.
    pub fn in_use(&self) -> Option<u32> {
        Some(self.total?.saturating_sub(self.available?))
    }

    /// Whether EC2 counts it as capacity: `active` (paid for, usable) or `pending` (not yet).
    pub fn live(&self) -> bool {
        matches!(self.state.as_deref(), Some("active" | "pending"))
    }
}

/// What the view needs of a cluster node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Its [`RESERVATION_LABEL`], if any.
    pub reservation: Option<String>,
}

/// One reservation with the nodes that joined from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub reservation: Reservation,
    /// Cluster nodes carrying its ID in [`RESERVATION_LABEL`], by name.
    pub joined: Vec<String>,
}

impl Row {
    /// Active, and not one node of this cluster joined from it: capacity paid for and unused
    /// here (its instances may run elsewhere: [`Reservation::in_use`] says).
    pub fn idle(&self) -> bool {
        self.reservation.state.as_deref() == Some("active") && self.joined.is_empty()
    }

    /// How long it has been [`Row::idle`] at `now`, counted from its start (a reservation no
    /// node ever joined from has been idle since it started): `None` when it is not idle, or
    /// EC2 did not say when it started.
    pub fn idle_for(&self, now: SystemTime) -> Option<Duration> {
        if !self.idle() {
            return None;
        }
        now.duration_since(self.reservation.start?).ok()
    }

    /// The note of the Event that says it has been idle `for_` (see [`View::idle_past`]).
    pub fn idle_note(&self, for_: Duration) -> String {
        let r = &self.reservation;
        let mut what = format!(
            "{} x {}",
            r.total.map_or_else(|| "?".to_string(), |n| n.to_string()),
            r.instance_type.as_deref().unwrap_or("?")
        );
        if let Some(zone) = &r.availability_zone {
            what.push_str(&format!(" in {zone}"));
        }
        if !r.network_nodes.is_empty() {
            what.push_str(&format!(" under {}", r.network_nodes.join(" / ")));
        }
        if let Some(block) = &r.capacity_block_id {
            what.push_str(&format!(", capacity block {block}"));
        }
        let since = r
            .start
            .map(|t| format!(" since {}", humantime::format_rfc3339_seconds(t)))
            .unwrap_or_default();
        let in_use = match r.in_use() {
            Some(0) => "no instance runs in it".to_string(),
            Some(n) => format!("{n} instance(s) run in it outside this cluster"),
            None => "EC2 did not say how many instances run in it".to_string(),
        };
        let minutes = Duration::from_secs(for_.as_secs() / 60 * 60);
        format!(
            "Capacity Reservation {} ({what}) has been active{since} ({}) and no node of this cluster joined from it (label {RESERVATION_LABEL}); {in_use}. It is paid for whether used or not: `ec2-topology-labeler tree --reservations` lists every reservation",
            r.id,
            humantime::format_duration(minutes)
        )
    }
}

/// The reservations EC2 places under one network path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placed {
    /// Network nodes, top first.
    pub path: Vec<String>,
    /// By ID.
    pub reservations: Vec<Row>,
}

/// Every reservation, placed under its network nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    /// By network path (top first).
    pub placed: Vec<Placed>,
    /// Reservations EC2 gives no network nodes for (type not supported, or neither active nor
    /// pending), by ID.
    pub unplaced: Vec<Row>,
    /// Reservation IDs cluster nodes carry that EC2 did not describe (another account's, an
    /// ended one no longer listed, a typo), with the nodes carrying them.
    pub unknown: BTreeMap<String, Vec<String>>,
}

/// The view of `reservations` and the cluster's `members`.
pub fn view(reservations: &[Reservation], members: &[Member]) -> View {
    let mut joined: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for m in members {
        if let Some(r) = m.reservation.as_deref().filter(|r| !r.is_empty()) {
            joined.entry(r).or_default().push(m.name.clone());
        }
    }
    let known: BTreeSet<&str> = reservations.iter().map(|r| r.id.as_str()).collect();
    let mut out = View::default();
    let mut placed: BTreeMap<Vec<String>, Vec<Row>> = BTreeMap::new();
    let mut sorted: Vec<&Reservation> = reservations.iter().collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    sorted.dedup_by(|a, b| a.id == b.id);
    for r in sorted {
        let mut names = joined.get(r.id.as_str()).cloned().unwrap_or_default();
        names.sort();
        let row = Row {
            reservation: r.clone(),
            joined: names,
        };
        if r.network_nodes.is_empty() {
            out.unplaced.push(row);
        } else {
            placed.entry(r.network_nodes.clone()).or_default().push(row);
        }
    }
    out.placed = placed
        .into_iter()
        .map(|(path, reservations)| Placed { path, reservations })
        .collect();
    for (id, mut names) in joined {
        if !known.contains(id) {
            names.sort();
            out.unknown.insert(id.to_string(), names);
        }
    }
    out
}

/// One series of the reserved-capacity metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// The deepest network node the reservation sits under; empty when unplaced.
    pub network_node: String,
    pub reservation: String,
    pub instance_type: String,
    /// Instances reserved (0 when EC2 did not say).
    pub reserved: u32,
    /// Cluster nodes joined from it.
    pub joined: u32,
}

impl View {
    /// Every row, placed first.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.placed
            .iter()
            .flat_map(|p| &p.reservations)
            .chain(&self.unplaced)
    }

    /// The reservations placed under `path` (top first), if any.
    pub fn under(&self, path: &[&str]) -> Option<&[Row]> {
        self.placed
            .iter()
            .find(|p| p.path.iter().map(String::as_str).eq(path.iter().copied()))
            .map(|p| p.reservations.as_slice())
    }

    /// The idle reservations ([`Row::idle`]) that started `after` or longer before `now`, with
    /// how long they have been idle, by ID: what the `ReservationIdle` Event is about.
    pub fn idle_past(&self, now: SystemTime, after: Duration) -> Vec<(&Row, Duration)> {
        let mut idle: Vec<(&Row, Duration)> = self
            .rows()
            .filter_map(|row| Some((row, row.idle_for(now)?)))
            .filter(|(_, for_)| *for_ >= after)
            .collect();
        idle.sort_by(|a, b| a.0.reservation.id.cmp(&b.0.reservation.id));
        idle
    }

    /// A series per live reservation (`active` or `pending`) for the metrics
    /// `reserved_instances` and `reserved_instances_joined`.
    pub fn series(&self) -> Vec<Series> {
        self.rows()
            .filter(|row| row.reservation.live())
            .map(|row| Series {
                network_node: row
                    .reservation
                    .network_nodes
                    .last()
                    .cloned()
                    .unwrap_or_default(),
                reservation: row.reservation.id.clone(),
                instance_type: row.reservation.instance_type.clone().unwrap_or_default(),
                reserved: row.reservation.total.unwrap_or(0),
                joined: u32::try_from(row.joined.len()).unwrap_or(u32::MAX),
            })
            .collect()
    }

    /// `tree --reservations`: each network path with the reservations under it, then those
    /// EC2 does not place, then labels naming reservations EC2 did not describe.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let rows: Vec<&Row> = self.rows().collect();
        let reserved: u32 = rows
            .iter()
            .filter(|r| r.reservation.live())
            .filter_map(|r| r.reservation.total)
            .sum();
        let joined: usize = rows.iter().map(|r| r.joined.len()).sum();
        let idle = rows.iter().filter(|r| r.idle()).count();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "reserved capacity: {} reservation(s), {reserved} instance(s) reserved (active or pending), {joined} node(s) joined, {idle} active with none joined",
            rows.len()
        );
        for placed in &self.placed {
            let _ = writeln!(s, "{}", placed.path.join(" / "));
            for row in &placed.reservations {
                line(&mut s, row);
            }
        }
        if !self.unplaced.is_empty() {
            let _ = writeln!(
                s,
                "(no network nodes from EC2: type not supported, or neither active nor pending)"
            );
            for row in &self.unplaced {
                line(&mut s, row);
            }
        }
        for (id, names) in &self.unknown {
            let _ = writeln!(
                s,
                "! {id}: carried by {} node(s) ({}), not a reservation EC2 describes",
                names.len(),
                names.join(", ")
            );
        }
        s
    }
}

fn line(s: &mut String, row: &Row) {
    use std::fmt::Write;
    let r = &row.reservation;
    let count = |n: Option<u32>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
    let _ = write!(
        s,
        "  {}  {}  {}  reserved {}  in use {}  joined {}",
        r.id,
        r.instance_type.as_deref().unwrap_or("?"),
        r.state.as_deref().unwrap_or("?"),
        count(r.total),
        count(r.in_use()),
        row.joined.len()
    );
    if let Some(block) = &r.capacity_block_id {
        let _ = write!(s, "  capacity block {block}");
    }
    if row.idle() {
        s.push_str("  (idle: none joined)");
    }
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(
        id: &str,
        state: &str,
        nodes: &[&str],
        total: u32,
        available: u32,
    ) -> Reservation {
        Reservation {
            id: id.into(),
            instance_type: Some("p5.48xlarge".into()),
            state: Some(state.into()),
            availability_zone: Some("us-east-1a".into()),
            network_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            total: Some(total),
            available: Some(available),
            ..Reservation::default()
        }
    }

    fn member(name: &str, reservation: Option<&str>) -> Member {
        Member {
            name: name.into(),
            reservation: reservation.map(str::to_string),
        }
    }

    #[test]
    fn reservations_sit_under_their_network_nodes_with_the_nodes_that_joined_from_them() {
        let v = view(
            &[
                reservation("cr-b", "active", &["nn-1", "nn-2", "nn-3"], 16, 4),
                reservation("cr-a", "active", &["nn-1", "nn-2", "nn-3"], 8, 8),
                reservation("cr-c", "pending", &["nn-1", "nn-2", "nn-4"], 4, 4),
                reservation("cr-x", "expired", &[], 2, 0),
            ],
            &[
                member("n2", Some("cr-b")),
                member("n1", Some("cr-b")),
                member("n3", None),
                member("n4", Some("cr-gone")),
                member("n5", Some("")),
            ],
        );
        let under = v.under(&["nn-1", "nn-2", "nn-3"]).expect("placed");
        assert_eq!(
            under
                .iter()
                .map(|r| r.reservation.id.as_str())
                .collect::<Vec<_>>(),
            ["cr-a", "cr-b"],
            "by ID"
        );
        assert_eq!(under[1].joined, ["n1", "n2"]);
        assert_eq!(under[1].reservation.in_use(), Some(12));
        assert!(under[0].idle(), "active, none joined");
        assert!(!under[1].idle());
        assert!(
            !v.under(&["nn-1", "nn-2", "nn-4"]).expect("placed")[0].idle(),
            "pending is not idle: nothing can join yet"
        );
        assert_eq!(v.unplaced.len(), 1);
        assert_eq!(
            v.unknown.get("cr-gone").map(Vec::as_slice),
            Some(&["n4".to_string()][..])
        );
        assert_eq!(v.unknown.len(), 1, "an empty label names nothing");
    }

    #[test]
    fn series_count_live_reservations_under_their_deepest_network_node() {
        let v = view(
            &[
                reservation("cr-a", "active", &["nn-1", "nn-2", "nn-3"], 16, 4),
                reservation("cr-p", "pending", &[], 4, 4),
                reservation("cr-x", "cancelled", &[], 2, 2),
            ],
            &[member("n1", Some("cr-a")), member("n2", Some("cr-a"))],
        );
        let series = v.series();
        assert_eq!(
            series,
            [
                Series {
                    network_node: "nn-3".into(),
                    reservation: "cr-a".into(),
                    instance_type: "p5.48xlarge".into(),
                    reserved: 16,
                    joined: 2,
                },
                Series {
                    network_node: String::new(),
                    reservation: "cr-p".into(),
                    instance_type: "p5.48xlarge".into(),
                    reserved: 4,
                    joined: 0,
                },
            ],
            "a cancelled reservation is no capacity"
        );
    }

    #[test]
    fn a_reservation_listed_twice_counts_once() {
        let r = reservation("cr-a", "active", &["nn-1"], 2, 0);
        let v = view(&[r.clone(), r], &[member("n1", Some("cr-a"))]);
        assert_eq!(v.rows().count(), 1);
        assert_eq!(v.series()[0].joined, 1);
    }

    #[test]
    fn the_text_names_each_path_reservation_and_what_is_missing() {
        let mut unknown_counts = reservation("cr-q", "active", &["nn-1", "nn-9"], 0, 0);
        unknown_counts.total = None;
        unknown_counts.available = None;
        unknown_counts.capacity_block_id = Some("cb-1".into());
        let v = view(
            &[
                reservation("cr-a", "active", &["nn-1", "nn-2"], 16, 4),
                unknown_counts,
                reservation("cr-x", "expired", &[], 2, 2),
            ],
            &[member("n1", Some("cr-a")), member("n9", Some("cr-zz"))],
        );
        let text = v.render();
        assert_eq!(
            text,
            "reserved capacity: 3 reservation(s), 16 instance(s) reserved (active or pending), 1 node(s) joined, 1 active with none joined\n\
             nn-1 / nn-2\n  cr-a  p5.48xlarge  active  reserved 16  in use 12  joined 1\n\
             nn-1 / nn-9\n  cr-q  p5.48xlarge  active  reserved ?  in use ?  joined 0  capacity block cb-1  (idle: none joined)\n\
             (no network nodes from EC2: type not supported, or neither active nor pending)\n  cr-x  p5.48xlarge  expired  reserved 2  in use 0  joined 0\n\
             ! cr-zz: carried by 1 node(s) (n9), not a reservation EC2 describes\n"
        );
    }
}

#[cfg(test)]
mod idle {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn at(hours_ago: u64, now: SystemTime) -> Option<SystemTime> {
        now.checked_sub(HOUR * u32::try_from(hours_ago).unwrap_or(0))
    }

    fn started(id: &str, state: &str, start: Option<SystemTime>) -> Reservation {
        Reservation {
            id: id.into(),
            instance_type: Some("p5.48xlarge".into()),
            state: Some(state.into()),
            availability_zone: Some("us-east-1a".into()),
            network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-3".into()],
            total: Some(4),
            available: Some(4),
            start,
            ..Reservation::default()
        }
    }

    #[test]
    fn an_active_reservation_nobody_joined_is_idle_past_the_threshold_from_its_start() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let v = view(
            &[
                started("cr-old", "active", at(3, now)),
                started("cr-new", "active", at(0, now)),
                started("cr-used", "active", at(5, now)),
                started("cr-pending", "pending", at(5, now)),
                started("cr-undated", "active", None),
                started("cr-future", "active", now.checked_add(HOUR)),
            ],
            &[Member {
                name: "n1".into(),
                reservation: Some("cr-used".into()),
            }],
        );
        let idle: Vec<(&str, Duration)> = v
            .idle_past(now, 2 * HOUR)
            .into_iter()
            .map(|(row, for_)| (row.reservation.id.as_str(), for_))
            .collect();
        assert_eq!(
            idle,
            [("cr-old", 3 * HOUR)],
            "not one under the threshold, joined, pending, of unknown or future start"
        );
        assert_eq!(v.idle_past(now, 4 * HOUR), []);
    }

    #[test]
    fn the_note_says_what_is_idle_where_since_when_and_how_to_see_all() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let mut r = started("cr-0123456789abcdef0", "active", at(6, now));
        r.available = Some(3);
        r.capacity_block_id = Some("cb-1".into());
        let v = view(&[r], &[]);
        let (row, for_) = v.idle_past(now, HOUR)[0];
        let note = row.idle_note(for_ + Duration::from_secs(59));
        assert_eq!(
            note,
            "Capacity Reservation cr-0123456789abcdef0 (4 x p5.48xlarge in us-east-1a under nn-1 / nn-2 / nn-3, capacity block cb-1) has been active since 2026-05-28T14:26:40Z (6h) and no node of this cluster joined from it (label karpenter.k8s.aws/capacity-reservation-id); 1 instance(s) run in it outside this cluster. It is paid for whether used or not: `ec2-topology-labeler tree --reservations` lists every reservation"
        );
        assert!(note.len() < 1000, "within the Events API's note limit");
    }

    #[test]
    fn the_start_reads_and_writes_as_rfc3339() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let r = started("cr-a", "active", Some(now));
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json["start"], "2026-05-28T20:26:40Z");
        let back: Reservation = serde_json::from_value(json).expect("reads back");
        assert_eq!(back.start, Some(now));
        let none: Reservation =
            serde_json::from_value(serde_json::json!({"id": "cr-b"})).expect("no start");
        assert_eq!(none.start, None);
    }
}

#[cfg(test)]
mod json {
    use super::*;

    #[test]
    fn the_view_reads_as_json() {
        let v = view(
            &[Reservation {
                id: "cr-a".into(),
                state: Some("active".into()),
                network_nodes: vec!["nn-1".into()],
                ..Reservation::default()
            }],
            &[],
        );
        let json = serde_json::to_value(&v).expect("serializes");
        assert_eq!(json["placed"][0]["path"][0], "nn-1");
        assert_eq!(
            json["placed"][0]["reservations"][0]["reservation"]["id"],
            "cr-a"
        );
    }
}
