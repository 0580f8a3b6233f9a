//! EC2's Capacity Reservation calls, as the EC2 API Reference and the SDK's model document them:
//!
//! - `DescribeCapacityReservationTopology`: each reservation's network nodes (top first), known
//!   before any instance runs in it. At most 10 `CapacityReservationId.N` a call (the SDK model
//!   says 10; the API Reference page has said 100: the stricter holds here); `MaxResults` 1–10,
//!   default 10, and not together with IDs; paginated by `NextToken`; filters
//!   `availability-zone` and `instance-type` (wildcards). `networkNodeSet` is absent for an
//!   instance type topology does not support and for a reservation neither `active` nor
//!   `pending`; `capacityBlockId` only for UltraServer reservations.
//! - `DescribeCapacityReservations`: the counts (`totalInstanceCount`,
//!   `availableInstanceCount`) and state; `MaxResults` 5–1000, paginated; filters `state`,
//!   `instance-type`, `availability-zone`.
//!
//! An ID EC2 does not know fails the whole call (`InvalidCapacityReservationId.NotFound`), one
//! not shaped as `cr-` and 17 hex digits too (`…Malformed`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    ApiError, MockEc2, Outcome, XMLNS, indexed,
    query::{self, element},
    wildcard_match,
};

/// The IDs one `DescribeCapacityReservationTopology` call may name.
pub const MAX_TOPOLOGY_IDS: usize = 10;
const TOPOLOGY_PAGE: usize = 10;
const RESERVATIONS_PAGE_MIN: usize = 5;
const RESERVATIONS_PAGE_MAX: usize = 1000;

/// One Capacity Reservation (an ODCR or a Capacity Block) as the mock holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservation {
    pub capacity_reservation_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub availability_zone_id: String,
    /// `active`, `pending`, `expired`, `cancelled`, `scheduled`, …
    #[serde(default = "active")]
    pub state: String,
    /// Where EC2 places it, top first (empty for an instance type topology does not support);
    /// answered only while the reservation is `active` or `pending`.
    #[serde(default)]
    pub network_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_block_id: Option<String>,
    pub total_instance_count: u32,
    pub available_instance_count: u32,
    /// When it started, as EC2 writes timestamps (`2026-12-05T10:00:00.000Z`); the
    /// reservations call's `startDate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_date: Option<String>,
}

fn active() -> String {
    "active".into()
}

/// What EC2 accepts as a reservation ID: `cr-` and 17 lowercase hex digits.
fn is_reservation_id(id: &str) -> bool {
    id.strip_prefix("cr-").is_some_and(|hex| {
        hex.len() == 17
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The two actions served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Topology,
    Reservations,
}

impl Action {
    pub(super) fn of(name: &str) -> Option<Self> {
        match name {
            "DescribeCapacityReservationTopology" => Some(Self::Topology),
            "DescribeCapacityReservations" => Some(Self::Reservations),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Topology => "DescribeCapacityReservationTopology",
            Self::Reservations => "DescribeCapacityReservations",
        }
    }
}

#[derive(Debug, Default)]
struct Request {
    dry_run: bool,
    ids: Vec<String>,
    filters: Vec<(String, Vec<String>)>,
    page: usize,
    offset: usize,
}

fn parse(action: Action, params: &[(String, String)]) -> Result<Request, ApiError> {
    query::require_version(params)?;
    let ids: Vec<String> = indexed(params, "CapacityReservationId")
        .into_iter()
        .map(|(_, v)| v.to_string())
        .collect();
    if action == Action::Topology && ids.len() > MAX_TOPOLOGY_IDS {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            format!("The maximum number of Capacity Reservation IDs is {MAX_TOPOLOGY_IDS}."),
        ));
    }
    if let Some(id) = ids.iter().find(|id| !is_reservation_id(id)) {
        return Err(ApiError::bad(
            "InvalidCapacityReservationId.Malformed",
            format!("Invalid id: \"{id}\" (expecting \"cr-...\")"),
        ));
    }
    if action == Action::Topology && !ids.is_empty() && query::get(params, "MaxResults").is_some() {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            "The parameter CapacityReservationIds cannot be used with the parameter MaxResults",
        ));
    }
    let page = match action {
        Action::Topology => query::page_size(params, 1, TOPOLOGY_PAGE, TOPOLOGY_PAGE)?,
        Action::Reservations => query::page_size(
            params,
            RESERVATIONS_PAGE_MIN,
            RESERVATIONS_PAGE_MAX,
            usize::MAX,
        )?,
    };
    let allowed: &[&str] = match action {
        Action::Topology => &["availability-zone", "instance-type"],
        Action::Reservations => &["availability-zone", "instance-type", "state"],
    };
    Ok(Request {
        dry_run: query::dry_run(params),
        ids,
        filters: query::filters(params, allowed)?,
        page,
        offset: query::offset(params)?,
    })
}

impl Request {
    fn matches(&self, r: &CapacityReservation) -> bool {
        (self.ids.is_empty() || self.ids.contains(&r.capacity_reservation_id))
            && self.filters.iter().all(|(name, values)| {
                let field = match name.as_str() {
                    "availability-zone" => &r.availability_zone,
                    "instance-type" => &r.instance_type,
                    _ => &r.state,
                };
                values.iter().any(|v| wildcard_match(v, field))
            })
    }
}

/// Statistics of these two actions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReservationStats {
    /// `DescribeCapacityReservationTopology` requests, whatever their outcome.
    pub topology_calls: u64,
    /// `CapacityReservationId.N` in each topology request, in arrival order.
    pub topology_ids_per_call: Vec<usize>,
    /// `DescribeCapacityReservations` requests, whatever their outcome.
    pub reservations_calls: u64,
    /// Requests of either refused (bad parameters, unknown IDs, not authorized).
    pub failed: u64,
}

impl MockEc2 {
    pub fn set_reservations(&self, reservations: Vec<CapacityReservation>) {
        self.lock().reservations = reservations
            .into_iter()
            .map(|r| (r.capacity_reservation_id.clone(), r))
            .collect();
    }

    pub fn reservations(&self) -> Vec<CapacityReservation> {
        self.lock().reservations.values().cloned().collect()
    }

    pub fn reservation_stats(&self) -> ReservationStats {
        self.lock().reservation_stats.clone()
    }

    /// One call of either action (signature checks, when on, as for every EC2 call).
    pub(super) fn handle_reservations(
        &self,
        action: Action,
        params: &[(String, String)],
        signed: Option<&super::auth::SignedRequest<'_>>,
    ) -> Outcome {
        let mut inner = self.lock();
        let request_id = inner.next_request_id();
        let latency = Duration::from_millis(inner.faults.latency_ms);
        let request = parse(action, params);
        let stats = &mut inner.reservation_stats;
        match action {
            Action::Topology => {
                stats.topology_calls += 1;
                stats
                    .topology_ids_per_call
                    .push(request.as_ref().map_or(0, |r| r.ids.len()));
            }
            Action::Reservations => stats.reservations_calls += 1,
        }
        let refuse = |inner: &mut super::Inner, e: ApiError| {
            inner.reservation_stats.failed += 1;
            Outcome::Error(e, request_id.clone()).after(latency)
        };
        let request = match request {
            Ok(r) => r,
            Err(e) => return refuse(&mut inner, e),
        };
        let denied = inner.faults.unauthorized || inner.faults.reservations_unauthorized;
        if let Err(e) = self.admit(signed, denied, action.name(), request.dry_run) {
            return refuse(&mut inner, e);
        }
        if let Some(unknown) = request
            .ids
            .iter()
            .find(|id| !inner.reservations.contains_key(*id))
        {
            let e = ApiError::bad(
                "InvalidCapacityReservationId.NotFound",
                format!("The capacity reservation ID '{unknown}' does not exist"),
            );
            return refuse(&mut inner, e);
        }
        // The API Reference says both that the topology call describes pending and active
        // reservations and that it gives others without network nodes: either, as asked.
        let active_only =
            action == Action::Topology && inner.faults.reservations_topology_active_only;
        let matching: Vec<&CapacityReservation> = inner
            .reservations
            .values()
            .filter(|r| request.matches(r))
            .filter(|r| !active_only || matches!(r.state.as_str(), "active" | "pending"))
            .collect();
        let (items, next) = query::page(&matching, request.offset, request.page);
        let body = match action {
            Action::Topology => topology_xml(&request_id, items, next.as_deref()),
            Action::Reservations => reservations_xml(&request_id, items, next.as_deref()),
        };
        Outcome::Raw(body, latency)
    }
}

fn topology_xml(request_id: &str, items: &[&CapacityReservation], next: Option<&str>) -> String {
    use std::fmt::Write;
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<DescribeCapacityReservationTopologyResponse xmlns=\"{XMLNS}\">"
    );
    let _ = writeln!(s, "    <requestId>{request_id}</requestId>");
    s.push_str("    <capacityReservationSet>\n");
    let i = "            ";
    for r in items {
        s.push_str("        <item>\n");
        element(
            &mut s,
            i,
            "capacityReservationId",
            &r.capacity_reservation_id,
        );
        if let Some(c) = &r.capacity_block_id {
            element(&mut s, i, "capacityBlockId", c);
        }
        element(&mut s, i, "state", &r.state);
        element(&mut s, i, "instanceType", &r.instance_type);
        if let Some(g) = &r.group_name {
            element(&mut s, i, "groupName", g);
        }
        // Documented: null or empty for an unsupported type, or a reservation that is neither
        // active nor pending.
        if matches!(r.state.as_str(), "active" | "pending") && !r.network_nodes.is_empty() {
            let _ = writeln!(s, "{i}<networkNodeSet>");
            for n in &r.network_nodes {
                element(&mut s, &format!("{i}    "), "item", n);
            }
            let _ = writeln!(s, "{i}</networkNodeSet>");
        }
        element(&mut s, i, "availabilityZoneId", &r.availability_zone_id);
        element(&mut s, i, "availabilityZone", &r.availability_zone);
        s.push_str("        </item>\n");
    }
    s.push_str("    </capacityReservationSet>\n");
    if let Some(t) = next {
        let _ = writeln!(s, "    <nextToken>{t}</nextToken>");
    }
    s.push_str("</DescribeCapacityReservationTopologyResponse>\n");
    s
}

fn reservations_xml(
    request_id: &str,
    items: &[&CapacityReservation],
    next: Option<&str>,
) -> String {
    use std::fmt::Write;
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<DescribeCapacityReservationsResponse xmlns=\"{XMLNS}\">"
    );
    let _ = writeln!(s, "    <requestId>{request_id}</requestId>");
    s.push_str("    <capacityReservationSet>\n");
    let i = "            ";
    for r in items {
        s.push_str("        <item>\n");
        element(
            &mut s,
            i,
            "capacityReservationId",
            &r.capacity_reservation_id,
        );
        element(&mut s, i, "ownerId", "111122223333");
        element(&mut s, i, "availabilityZoneId", &r.availability_zone_id);
        element(&mut s, i, "instanceType", &r.instance_type);
        element(&mut s, i, "instancePlatform", "Linux/UNIX");
        element(&mut s, i, "availabilityZone", &r.availability_zone);
        element(&mut s, i, "tenancy", "default");
        let _ = writeln!(
            s,
            "{i}<totalInstanceCount>{}</totalInstanceCount>",
            r.total_instance_count
        );
        let _ = writeln!(
            s,
            "{i}<availableInstanceCount>{}</availableInstanceCount>",
            r.available_instance_count
        );
        element(&mut s, i, "state", &r.state);
        if let Some(t) = &r.start_date {
            element(&mut s, i, "startDate", t);
        }
        if let Some(c) = &r.capacity_block_id {
            element(&mut s, i, "capacityBlockId", c);
        }
        s.push_str("        </item>\n");
    }
    s.push_str("    </capacityReservationSet>\n");
    if let Some(t) = next {
        let _ = writeln!(s, "    <nextToken>{t}</nextToken>");
    }
    s.push_str("</DescribeCapacityReservationsResponse>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::testing::{body, params, refused};

    fn cr(n: u32, state: &str, nodes: &[&str]) -> CapacityReservation {
        CapacityReservation {
            capacity_reservation_id: format!("cr-{n:017x}"),
            instance_type: "p5.48xlarge".into(),
            availability_zone: "us-east-1a".into(),
            availability_zone_id: "use1-az1".into(),
            state: state.into(),
            network_nodes: nodes.iter().map(|s| s.to_string()).collect(),
            group_name: None,
            capacity_block_id: None,
            total_instance_count: 4,
            available_instance_count: 1,
            start_date: None,
        }
    }

    #[test]
    fn topology_pages_by_ten_and_gives_network_nodes_only_while_active_or_pending() {
        let mock = MockEc2::default();
        let mut all: Vec<CapacityReservation> = (1..=12)
            .map(|n| cr(n, "active", &["nn-1", "nn-2", "nn-3"]))
            .collect();
        all[1].state = "expired".into();
        all[2].state = "pending".into();
        mock.set_reservations(all);
        let first = body(mock.handle_reservations(
            Action::Topology,
            &params("DescribeCapacityReservationTopology", &[]),
            None,
        ));
        assert_eq!(first.matches("<capacityReservationId>").count(), 10);
        assert_eq!(
            first.matches("<networkNodeSet>").count(),
            9,
            "not for the expired one; the pending one has its nodes"
        );
        let token = first
            .split("<nextToken>")
            .nth(1)
            .and_then(|t| t.split('<').next())
            .expect("a next page");
        let second = body(mock.handle_reservations(
            Action::Topology,
            &params(
                "DescribeCapacityReservationTopology",
                &[("NextToken", token)],
            ),
            None,
        ));
        assert_eq!(second.matches("<capacityReservationId>").count(), 2);
        assert!(!second.contains("<nextToken>"), "the last page");
    }

    #[test]
    fn topology_refuses_what_ec2_refuses() {
        let mock = MockEc2::default();
        mock.set_reservations(vec![cr(1, "active", &["nn-1"])]);
        let ask = |extra: &[(&str, &str)]| {
            mock.handle_reservations(
                Action::Topology,
                &params("DescribeCapacityReservationTopology", extra),
                None,
            )
        };
        let eleven: Vec<(String, String)> = (1..=11)
            .map(|n| (format!("CapacityReservationId.{n}"), format!("cr-{n:017x}")))
            .collect();
        let eleven: Vec<(&str, &str)> = eleven
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(refused(ask(&eleven)), "InvalidParameterValue");
        assert_eq!(
            refused(ask(&[
                ("CapacityReservationId.1", "cr-00000000000000001"),
                ("MaxResults", "5")
            ])),
            "InvalidParameterCombination"
        );
        assert_eq!(
            refused(ask(&[("MaxResults", "11")])),
            "InvalidParameterValue"
        );
        assert_eq!(
            refused(ask(&[("CapacityReservationId.1", "cr-1")])),
            "InvalidCapacityReservationId.Malformed"
        );
        assert_eq!(
            refused(ask(&[("CapacityReservationId.1", "cr-00000000000000002")])),
            "InvalidCapacityReservationId.NotFound"
        );
        assert_eq!(
            refused(ask(&[("Filter.1.Name", "state")])),
            "InvalidParameterValue"
        );
        let one = body(ask(&[("CapacityReservationId.1", "cr-00000000000000001")]));
        assert!(one.contains("<item>nn-1</item>"), "{one}");
        let stats = mock.reservation_stats();
        assert_eq!(stats.topology_calls, 7);
        assert_eq!(stats.failed, 6);
    }

    #[test]
    fn reservations_give_the_counts_and_filter_by_state() {
        let mock = MockEc2::default();
        let mut started = cr(1, "active", &[]);
        started.start_date = Some("2026-12-05T10:00:00.000Z".into());
        mock.set_reservations(vec![started, cr(2, "expired", &[])]);
        let text = body(mock.handle_reservations(
            Action::Reservations,
            &params(
                "DescribeCapacityReservations",
                &[("Filter.1.Name", "state"), ("Filter.1.Value.1", "active")],
            ),
            None,
        ));
        assert_eq!(text.matches("<capacityReservationId>").count(), 1);
        assert!(text.contains("<totalInstanceCount>4</totalInstanceCount>"));
        assert!(text.contains("<availableInstanceCount>1</availableInstanceCount>"));
        assert!(text.contains("<startDate>2026-12-05T10:00:00.000Z</startDate>"));
    }

    #[test]
    fn a_dry_run_says_whether_the_permission_is_there() {
        let mock = MockEc2::default();
        let dry = params("DescribeCapacityReservationTopology", &[("DryRun", "true")]);
        assert_eq!(
            refused(mock.handle_reservations(Action::Topology, &dry, None)),
            "DryRunOperation"
        );
        mock.set_faults(super::super::Faults {
            reservations_unauthorized: true,
            ..Default::default()
        });
        assert_eq!(
            refused(mock.handle_reservations(Action::Topology, &dry, None)),
            "UnauthorizedOperation"
        );
    }

    #[test]
    fn the_topology_call_can_leave_out_what_is_neither_active_nor_pending() {
        let mock = MockEc2::default();
        mock.set_reservations(vec![
            cr(1, "active", &["nn-1"]),
            cr(2, "expired", &["nn-1"]),
        ]);
        let ask = |mock: &MockEc2| {
            body(mock.handle_reservations(
                Action::Topology,
                &params("DescribeCapacityReservationTopology", &[]),
                None,
            ))
        };
        assert_eq!(ask(&mock).matches("<capacityReservationId>").count(), 2);
        mock.set_faults(super::super::Faults {
            reservations_topology_active_only: true,
            ..Default::default()
        });
        let only = ask(&mock);
        assert_eq!(only.matches("<capacityReservationId>").count(), 1, "{only}");
        let counted = body(mock.handle_reservations(
            Action::Reservations,
            &params("DescribeCapacityReservations", &[]),
            None,
        ));
        assert_eq!(
            counted.matches("<capacityReservationId>").count(),
            2,
            "the reservations call still lists both"
        );
    }

    #[test]
    fn a_missing_permission_is_refused_by_name() {
        let mock = MockEc2::default();
        mock.set_faults(super::super::Faults {
            reservations_unauthorized: true,
            ..Default::default()
        });
        let outcome = mock.handle_reservations(
            Action::Topology,
            &params("DescribeCapacityReservationTopology", &[]),
            None,
        );
        match outcome {
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => {
                assert_eq!(e.code, "UnauthorizedOperation");
                assert!(
                    e.message
                        .contains("ec2:DescribeCapacityReservationTopology")
                );
            }
            Outcome::Raw(body, _) => panic!("answered: {body}"),
        }
    }
}
