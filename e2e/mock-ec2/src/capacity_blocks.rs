//! EC2's Capacity Block calls, as the EC2 API Reference and the SDK's model document them
//! (the XML names are the SDK's deserializers'):
//!
//! - `DescribeCapacityBlocks`: each block's `ultraserverType` (UltraServer blocks only), zone,
//!   its Capacity Reservations (`capacityReservationIdSet`), `startDate`, `endDate`,
//!   `createDate` and `state` (`active`, `expired`, `unavailable`, `cancelled`, `failed`,
//!   `scheduled`, `payment-pending`, `payment-failed`). Filters `capacity-block-id`,
//!   `ultraserver-type`, `availability-zone`, `start-date`, `end-date`, `create-date`, `state`.
//! - `DescribeCapacityBlockStatus`: each block's `interconnectStatus` (`ok`, `impaired`,
//!   `insufficient-data`), `totalCapacity`, `totalAvailableCapacity`, `totalUnavailableCapacity`
//!   (instances unavailable after a failed status check) and the same per reservation
//!   (`capacityReservationStatusSet`). Filter `interconnect-status`.
//!
//! Both take `CapacityBlockId.N`, `MaxResults` (1–1000: the status call's documented range; the
//! blocks call's page is taken to be the same) and `NextToken`, and `DryRun`. The API Reference
//! names no error for a Capacity Block ID EC2 does not know: it is left out of the answer, as a
//! filter would (a caller must take a block missing from the answer as unknown, never as `ok`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    ApiError, MockEc2, Outcome, XMLNS, indexed,
    query::{self, element},
    wildcard_match,
};

const PAGE_MIN: usize = 1;
const PAGE_MAX: usize = 1000;

/// One Capacity Block as the mock holds it: what both calls answer about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBlock {
    pub capacity_block_id: String,
    /// The UltraServer type (`u-p6e-gb200x72`, `u-trn2x64`); absent for a block of instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ultraserver_type: Option<String>,
    pub availability_zone: String,
    pub availability_zone_id: String,
    #[serde(default)]
    pub capacity_reservation_ids: Vec<String>,
    /// Timestamps as EC2 writes them (`2026-12-05T10:00:00.000Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_date: Option<String>,
    #[serde(default = "active")]
    pub state: String,
    /// `ok`, `impaired` or `insufficient-data`.
    #[serde(default = "ok")]
    pub interconnect_status: String,
    pub total_capacity: u32,
    pub total_available_capacity: u32,
    #[serde(default)]
    pub total_unavailable_capacity: u32,
}

fn active() -> String {
    "active".into()
}

fn ok() -> String {
    "ok".into()
}

/// The two actions served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Blocks,
    Status,
}

impl Action {
    pub(super) fn of(name: &str) -> Option<Self> {
        match name {
            "DescribeCapacityBlocks" => Some(Self::Blocks),
            "DescribeCapacityBlockStatus" => Some(Self::Status),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Blocks => "DescribeCapacityBlocks",
            Self::Status => "DescribeCapacityBlockStatus",
        }
    }

    fn filters(self) -> &'static [&'static str] {
        match self {
            Self::Blocks => &[
                "capacity-block-id",
                "ultraserver-type",
                "availability-zone",
                "start-date",
                "end-date",
                "create-date",
                "state",
            ],
            Self::Status => &["interconnect-status"],
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
    Ok(Request {
        dry_run: query::dry_run(params),
        ids: indexed(params, "CapacityBlockId")
            .into_iter()
            .map(|(_, v)| v.to_string())
            .collect(),
        filters: query::filters(params, action.filters())?,
        page: query::page_size(params, PAGE_MIN, PAGE_MAX, PAGE_MAX)?,
        offset: query::offset(params)?,
    })
}

impl Request {
    fn matches(&self, b: &CapacityBlock) -> bool {
        let none = String::new();
        (self.ids.is_empty() || self.ids.contains(&b.capacity_block_id))
            && self.filters.iter().all(|(name, values)| {
                let field = match name.as_str() {
                    "capacity-block-id" => &b.capacity_block_id,
                    "ultraserver-type" => b.ultraserver_type.as_ref().unwrap_or(&none),
                    "availability-zone" => &b.availability_zone,
                    "start-date" => b.start_date.as_ref().unwrap_or(&none),
                    "end-date" => b.end_date.as_ref().unwrap_or(&none),
                    "create-date" => b.create_date.as_ref().unwrap_or(&none),
                    "interconnect-status" => &b.interconnect_status,
                    _ => &b.state,
                };
                values.iter().any(|v| wildcard_match(v, field))
            })
    }
}

/// Statistics of these two actions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CapacityBlockStats {
    /// `DescribeCapacityBlocks` requests, whatever their outcome.
    pub blocks_calls: u64,
    /// `DescribeCapacityBlockStatus` requests, whatever their outcome.
    pub status_calls: u64,
    /// Requests of either refused (bad parameters, not authorized, dry runs).
    pub failed: u64,
}

impl MockEc2 {
    pub fn set_capacity_blocks(&self, blocks: Vec<CapacityBlock>) {
        self.lock().capacity_blocks = blocks
            .into_iter()
            .map(|b| (b.capacity_block_id.clone(), b))
            .collect();
    }

    pub fn capacity_blocks(&self) -> Vec<CapacityBlock> {
        self.lock().capacity_blocks.values().cloned().collect()
    }

    /// Set one block's interconnect status (`ok`, `impaired`, `insufficient-data`); false when
    /// the mock does not hold the block.
    pub fn set_interconnect_status(&self, id: &str, status: &str) -> bool {
        match self.lock().capacity_blocks.get_mut(id) {
            Some(b) => {
                b.interconnect_status = status.to_string();
                true
            }
            None => false,
        }
    }

    pub fn capacity_block_stats(&self) -> CapacityBlockStats {
        self.lock().capacity_block_stats.clone()
    }

    /// One call of either action (signature checks, when on, as for every EC2 call).
    pub(super) fn handle_capacity_blocks(
        &self,
        action: Action,
        params: &[(String, String)],
        signed: Option<&super::auth::SignedRequest<'_>>,
    ) -> Outcome {
        let mut inner = self.lock();
        let request_id = inner.next_request_id();
        let latency = Duration::from_millis(inner.faults.latency_ms);
        match action {
            Action::Blocks => inner.capacity_block_stats.blocks_calls += 1,
            Action::Status => inner.capacity_block_stats.status_calls += 1,
        }
        let refuse = |inner: &mut super::Inner, e: ApiError| {
            inner.capacity_block_stats.failed += 1;
            Outcome::Error(e, request_id.clone()).after(latency)
        };
        let request = match parse(action, params) {
            Ok(r) => r,
            Err(e) => return refuse(&mut inner, e),
        };
        let denied = inner.faults.unauthorized || inner.faults.capacity_blocks_unauthorized;
        if let Err(e) = self.admit(signed, denied, action.name(), request.dry_run) {
            return refuse(&mut inner, e);
        }
        // EC2 failing (the same fault as DescribeInstanceTopology's): a server error.
        let fraction = inner.faults.error_5xx_fraction;
        if super::hit(&mut inner.spread.error_5xx, fraction) {
            return refuse(
                &mut inner,
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "An internal error has occurred.",
                ),
            );
        }
        let matching: Vec<&CapacityBlock> = inner
            .capacity_blocks
            .values()
            .filter(|b| request.matches(b))
            .collect();
        let (items, next) = query::page(&matching, request.offset, request.page);
        let body = match action {
            Action::Blocks => blocks_xml(&request_id, items, next.as_deref()),
            Action::Status => status_xml(&request_id, items, &inner, next.as_deref()),
        };
        Outcome::Raw(body, latency)
    }
}

fn blocks_xml(request_id: &str, items: &[&CapacityBlock], next: Option<&str>) -> String {
    use std::fmt::Write;
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(s, "<DescribeCapacityBlocksResponse xmlns=\"{XMLNS}\">");
    let _ = writeln!(s, "    <requestId>{request_id}</requestId>");
    s.push_str("    <capacityBlockSet>\n");
    let i = "            ";
    for b in items {
        s.push_str("        <item>\n");
        element(&mut s, i, "capacityBlockId", &b.capacity_block_id);
        if let Some(t) = &b.ultraserver_type {
            element(&mut s, i, "ultraserverType", t);
        }
        element(&mut s, i, "availabilityZone", &b.availability_zone);
        element(&mut s, i, "availabilityZoneId", &b.availability_zone_id);
        let _ = writeln!(s, "{i}<capacityReservationIdSet>");
        for r in &b.capacity_reservation_ids {
            element(&mut s, &format!("{i}    "), "item", r);
        }
        let _ = writeln!(s, "{i}</capacityReservationIdSet>");
        for (tag, value) in [
            ("startDate", &b.start_date),
            ("endDate", &b.end_date),
            ("createDate", &b.create_date),
        ] {
            if let Some(v) = value {
                element(&mut s, i, tag, v);
            }
        }
        element(&mut s, i, "state", &b.state);
        s.push_str("        </item>\n");
    }
    s.push_str("    </capacityBlockSet>\n");
    if let Some(t) = next {
        let _ = writeln!(s, "    <nextToken>{t}</nextToken>");
    }
    s.push_str("</DescribeCapacityBlocksResponse>\n");
    s
}

fn status_xml(
    request_id: &str,
    items: &[&CapacityBlock],
    inner: &super::Inner,
    next: Option<&str>,
) -> String {
    use std::fmt::Write;
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(s, "<DescribeCapacityBlockStatusResponse xmlns=\"{XMLNS}\">");
    let _ = writeln!(s, "    <requestId>{request_id}</requestId>");
    s.push_str("    <capacityBlockStatusSet>\n");
    let i = "            ";
    for b in items {
        s.push_str("        <item>\n");
        element(&mut s, i, "capacityBlockId", &b.capacity_block_id);
        element(&mut s, i, "interconnectStatus", &b.interconnect_status);
        let _ = writeln!(s, "{i}<totalCapacity>{}</totalCapacity>", b.total_capacity);
        let _ = writeln!(
            s,
            "{i}<totalAvailableCapacity>{}</totalAvailableCapacity>",
            b.total_available_capacity
        );
        let _ = writeln!(
            s,
            "{i}<totalUnavailableCapacity>{}</totalUnavailableCapacity>",
            b.total_unavailable_capacity
        );
        // Per reservation, from the reservations the mock holds under those IDs.
        let _ = writeln!(s, "{i}<capacityReservationStatusSet>");
        let j = format!("{i}        ");
        for r in b
            .capacity_reservation_ids
            .iter()
            .filter_map(|id| inner.reservations.get(id))
        {
            let _ = writeln!(s, "{i}    <item>");
            element(
                &mut s,
                &j,
                "capacityReservationId",
                &r.capacity_reservation_id,
            );
            let _ = writeln!(
                s,
                "{j}<totalCapacity>{}</totalCapacity>",
                r.total_instance_count
            );
            let _ = writeln!(
                s,
                "{j}<totalAvailableCapacity>{}</totalAvailableCapacity>",
                r.available_instance_count
            );
            let _ = writeln!(
                s,
                "{j}<totalUnavailableCapacity>0</totalUnavailableCapacity>"
            );
            let _ = writeln!(s, "{i}    </item>");
        }
        let _ = writeln!(s, "{i}</capacityReservationStatusSet>");
        s.push_str("        </item>\n");
    }
    s.push_str("    </capacityBlockStatusSet>\n");
    if let Some(t) = next {
        let _ = writeln!(s, "    <nextToken>{t}</nextToken>");
    }
    s.push_str("</DescribeCapacityBlockStatusResponse>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::testing::{body, params, refused};

    fn block(n: u32, ultraserver: Option<&str>, status: &str) -> CapacityBlock {
        CapacityBlock {
            capacity_block_id: format!("cb-{n:017x}"),
            ultraserver_type: ultraserver.map(str::to_string),
            availability_zone: "us-east-1a".into(),
            availability_zone_id: "use1-az1".into(),
            capacity_reservation_ids: vec![format!("cr-{n:017x}")],
            start_date: Some("2026-12-05T11:30:00.000Z".into()),
            end_date: Some("2026-12-19T11:30:00.000Z".into()),
            create_date: Some("2026-12-01T09:00:00.000Z".into()),
            state: "active".into(),
            interconnect_status: status.into(),
            total_capacity: 18,
            total_available_capacity: 2,
            total_unavailable_capacity: 1,
        }
    }

    fn next_token(text: &str) -> Option<String> {
        text.split("<nextToken>")
            .nth(1)
            .and_then(|t| t.split('<').next())
            .map(str::to_string)
    }

    #[test]
    fn blocks_give_the_ultraserver_type_dates_and_reservations_and_page() {
        let mock = MockEc2::default();
        mock.set_capacity_blocks(vec![
            block(1, Some("u-p6e-gb200x72"), "ok"),
            block(2, None, "ok"),
            block(3, Some("u-trn2x64"), "ok"),
        ]);
        let ask = |extra: &[(&str, &str)]| {
            body(mock.handle_capacity_blocks(
                Action::Blocks,
                &params("DescribeCapacityBlocks", extra),
                None,
            ))
        };
        let all = ask(&[]);
        assert_eq!(all.matches("<capacityBlockId>").count(), 3);
        assert!(all.contains("<ultraserverType>u-p6e-gb200x72</ultraserverType>"));
        assert_eq!(
            all.matches("<ultraserverType>").count(),
            2,
            "a block of instances has none"
        );
        assert!(all.contains("<endDate>2026-12-19T11:30:00.000Z</endDate>"));
        assert!(all.contains("<item>cr-00000000000000001</item>"));
        let first = ask(&[("MaxResults", "2")]);
        assert_eq!(first.matches("<capacityBlockId>").count(), 2);
        let token = next_token(&first).expect("a next page");
        let second = ask(&[("MaxResults", "2"), ("NextToken", &token)]);
        assert_eq!(second.matches("<capacityBlockId>").count(), 1);
        assert!(next_token(&second).is_none(), "the last page");
        let gb200 = ask(&[
            ("Filter.1.Name", "ultraserver-type"),
            ("Filter.1.Value.1", "u-p6e-*"),
        ]);
        assert_eq!(gb200.matches("<capacityBlockId>").count(), 1, "{gb200}");
        let one = ask(&[
            ("CapacityBlockId.1", "cb-00000000000000003"),
            ("CapacityBlockId.2", "cb-0000000000000abcd"),
        ]);
        assert_eq!(
            one.matches("<capacityBlockId>").count(),
            1,
            "an unknown ID is left out"
        );
    }

    #[test]
    fn status_gives_the_interconnect_and_capacity_and_follows_changes() {
        let mock = MockEc2::default();
        mock.set_capacity_blocks(vec![
            block(1, Some("u-p6e-gb200x72"), "ok"),
            block(2, Some("u-p6e-gb200x72"), "insufficient-data"),
        ]);
        let mut cr = super::super::reservations::CapacityReservation {
            capacity_reservation_id: "cr-00000000000000001".into(),
            instance_type: "p6e-gb200.36xlarge".into(),
            availability_zone: "us-east-1a".into(),
            availability_zone_id: "use1-az1".into(),
            state: "active".into(),
            network_nodes: vec![],
            group_name: None,
            capacity_block_id: Some("cb-00000000000000001".into()),
            total_instance_count: 18,
            available_instance_count: 2,
            start_date: None,
        };
        cr.available_instance_count = 3;
        mock.set_reservations(vec![cr]);
        let ask = |extra: &[(&str, &str)]| {
            body(mock.handle_capacity_blocks(
                Action::Status,
                &params("DescribeCapacityBlockStatus", extra),
                None,
            ))
        };
        let all = ask(&[]);
        assert_eq!(all.matches("<capacityBlockId>").count(), 2);
        assert!(all.contains("<interconnectStatus>insufficient-data</interconnectStatus>"));
        assert!(all.contains("<totalUnavailableCapacity>1</totalUnavailableCapacity>"));
        assert!(
            all.contains("<capacityReservationId>cr-00000000000000001</capacityReservationId>")
        );
        assert!(all.contains("<totalAvailableCapacity>3</totalAvailableCapacity>"));
        assert!(mock.set_interconnect_status("cb-00000000000000001", "impaired"));
        assert!(!mock.set_interconnect_status("cb-0000000000000ffff", "impaired"));
        let impaired = ask(&[
            ("Filter.1.Name", "interconnect-status"),
            ("Filter.1.Value.1", "impaired"),
        ]);
        assert_eq!(
            impaired.matches("<capacityBlockId>").count(),
            1,
            "{impaired}"
        );
        assert!(impaired.contains("cb-00000000000000001"));
        let stats = mock.capacity_block_stats();
        assert_eq!((stats.status_calls, stats.failed), (2, 0));
    }

    /// `PUT /_admin/capacity-blocks/{id}/interconnect` turns a block's interconnect, over HTTP.
    #[tokio::test]
    async fn the_admin_endpoint_sets_the_interconnect() {
        use http_body_util::Full;
        use hyper_util::{client::legacy::Client, rt::TokioExecutor};
        let mock = MockEc2::default();
        mock.set_capacity_blocks(vec![block(1, Some("u-p6e-gb200x72"), "ok")]);
        let url = super::super::spawn(mock.clone()).await.expect("serves");
        let client: Client<_, Full<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let put = |id: &str, status: &str| {
            let request =
                http::Request::put(format!("{url}/_admin/capacity-blocks/{id}/interconnect"))
                    .body(Full::new(bytes::Bytes::from(status.to_string())))
                    .expect("a request");
            client.request(request)
        };
        let status = |r: Result<http::Response<_>, _>| r.expect("answered").status().as_u16();
        assert_eq!(status(put("cb-00000000000000001", "impaired").await), 204);
        assert_eq!(mock.capacity_blocks()[0].interconnect_status, "impaired");
        assert_eq!(status(put("cb-00000000000000001", "broken").await), 400);
        assert_eq!(status(put("cb-0000000000000ffff", "ok").await), 404);
        assert_eq!(mock.capacity_blocks()[0].interconnect_status, "impaired");
    }

    #[test]
    fn both_refuse_what_ec2_refuses() {
        let mock = MockEc2::default();
        mock.set_capacity_blocks(vec![block(1, None, "ok")]);
        for (action, name) in [
            (Action::Blocks, "DescribeCapacityBlocks"),
            (Action::Status, "DescribeCapacityBlockStatus"),
        ] {
            let ask = |extra: &[(&str, &str)]| {
                mock.handle_capacity_blocks(action, &params(name, extra), None)
            };
            assert_eq!(
                refused(ask(&[("MaxResults", "0")])),
                "InvalidParameterValue"
            );
            assert_eq!(
                refused(ask(&[("MaxResults", "1001")])),
                "InvalidParameterValue"
            );
            assert_eq!(
                refused(ask(&[("NextToken", "garbage")])),
                "InvalidParameterValue"
            );
            assert_eq!(
                refused(ask(&[("Filter.1.Name", "instance-type")])),
                "InvalidParameterValue"
            );
            assert_eq!(refused(ask(&[("DryRun", "true")])), "DryRunOperation");
            let unversioned = vec![("Action".to_string(), name.to_string())];
            assert_eq!(
                refused(mock.handle_capacity_blocks(action, &unversioned, None)),
                "MissingParameter"
            );
        }
        mock.set_faults(super::super::Faults {
            capacity_blocks_unauthorized: true,
            ..Default::default()
        });
        match mock.handle_capacity_blocks(
            Action::Status,
            &params("DescribeCapacityBlockStatus", &[]),
            None,
        ) {
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => {
                assert_eq!(e.code, "UnauthorizedOperation");
                assert!(e.message.contains("ec2:DescribeCapacityBlockStatus"));
            }
            Outcome::Raw(body, _) => panic!("answered: {body}"),
        }
        // EC2 failing: a server error, as DescribeInstanceTopology gets.
        mock.set_faults(super::super::Faults {
            error_5xx_fraction: 1.0,
            ..Default::default()
        });
        match mock.handle_capacity_blocks(
            Action::Status,
            &params("DescribeCapacityBlockStatus", &[]),
            None,
        ) {
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => {
                assert_eq!(e.code, "InternalError");
                assert_eq!(e.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
            }
            Outcome::Raw(body, _) => panic!("answered: {body}"),
        }
        let stats = mock.capacity_block_stats();
        assert_eq!(stats.blocks_calls + stats.status_calls, stats.failed);
    }
}
