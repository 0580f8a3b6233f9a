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

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::{
    ApiError, MockEc2, Outcome, XMLNS, decode_token, encode_token, indexed, wildcard_match,
    xml_escape,
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
    let get = |k: &str| params.iter().find(|(p, _)| p == k).map(|(_, v)| v.as_str());
    if get("Version").is_none() {
        return Err(ApiError::bad(
            "MissingParameter",
            "The request must contain the parameter Version",
        ));
    }
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
    let (min, max, default) = match action {
        Action::Topology => (1, TOPOLOGY_PAGE, TOPOLOGY_PAGE),
        Action::Reservations => (RESERVATIONS_PAGE_MIN, RESERVATIONS_PAGE_MAX, usize::MAX),
    };
    let page = match get("MaxResults") {
        None => default,
        Some(_) if action == Action::Topology && !ids.is_empty() => {
            return Err(ApiError::bad(
                "InvalidParameterCombination",
                "The parameter CapacityReservationIds cannot be used with the parameter MaxResults",
            ));
        }
        Some(m) => match m.parse::<usize>() {
            Ok(n) if (min..=max).contains(&n) => n,
            _ => {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!(
                        "Value ( {m} ) for parameter maxResults is invalid. Expecting a value between {min} and {max}."
                    ),
                ));
            }
        },
    };
    let offset = match get("NextToken") {
        None => 0,
        Some(t) => decode_token(t)
            .ok_or_else(|| ApiError::bad("InvalidParameterValue", "The nextToken is invalid"))?,
    };
    let allowed: &[&str] = match action {
        Action::Topology => &["availability-zone", "instance-type"],
        Action::Reservations => &["availability-zone", "instance-type", "state"],
    };
    let mut indices: Vec<u32> = params
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("Filter.")?.split('.').next()?.parse().ok())
        .collect();
    indices.sort_unstable();
    indices.dedup();
    let mut filters = Vec::new();
    for n in indices {
        let name = get(&format!("Filter.{n}.Name")).ok_or_else(|| {
            ApiError::bad(
                "InvalidParameterValue",
                format!("Filter.{n}.Name is missing"),
            )
        })?;
        if !allowed.contains(&name) {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("The filter '{name}' is invalid"),
            ));
        }
        let values = indexed(params, &format!("Filter.{n}.Value"))
            .into_iter()
            .map(|(_, v)| v.to_string())
            .collect();
        filters.push((name.to_string(), values));
    }
    Ok(Request {
        dry_run: get("DryRun") == Some("true"),
        ids,
        filters,
        page,
        offset,
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
        inner.request_seq += 1;
        let request_id = format!("00000000-0000-4000-8000-{:012x}", inner.request_seq);
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
        if let Some(signed) = signed
            && let Err(e) = self
                .registry()
                .authenticate(signed, std::time::SystemTime::now())
        {
            return refuse(&mut inner, e);
        }
        if inner.faults.unauthorized || inner.faults.reservations_unauthorized {
            let e = ApiError::new(
                StatusCode::FORBIDDEN,
                "UnauthorizedOperation",
                format!(
                    "You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/labeler is not authorized to perform: ec2:{}",
                    action.name()
                ),
            );
            return refuse(&mut inner, e);
        }
        // As documented: a dry run says whether the call would be allowed, once the caller's
        // credentials and permission are known.
        if request.dry_run {
            let e = ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "DryRunOperation",
                "Request would have succeeded, but DryRun flag is set.",
            );
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
        let end = request
            .offset
            .saturating_add(request.page)
            .min(matching.len());
        let items = matching.get(request.offset..end).unwrap_or_default();
        let next = (end < matching.len()).then(|| encode_token(end));
        let body = match action {
            Action::Topology => topology_xml(&request_id, items, next.as_deref()),
            Action::Reservations => reservations_xml(&request_id, items, next.as_deref()),
        };
        Outcome::Raw(body, latency)
    }
}

fn element(s: &mut String, indent: &str, tag: &str, value: &str) {
    use std::fmt::Write;
    let _ = writeln!(s, "{indent}<{tag}>{}</{tag}>", xml_escape(value));
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

    fn params(action: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut p = vec![
            ("Action".to_string(), action.to_string()),
            ("Version".to_string(), super::super::API_VERSION.to_string()),
        ];
        p.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        p
    }

    fn body(outcome: Outcome) -> String {
        match outcome {
            Outcome::Raw(body, _) => body,
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => {
                panic!("refused: {} {}", e.code, e.message)
            }
        }
    }

    fn refused(outcome: Outcome) -> &'static str {
        match outcome {
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => e.code,
            Outcome::Raw(body, _) => panic!("answered: {body}"),
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
