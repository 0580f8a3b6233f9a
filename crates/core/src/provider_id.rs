//! From a Node's `spec.providerID` to the EC2 instance behind it.
//!
//! EC2 nodes carry `aws:///<zone>/<instance-id>`; the zone may be empty or a Local Zone. Anything
//! else (Fargate, EKS Hybrid Nodes, other clouds, an ID not yet set) is skipped with a reason.

use std::fmt;

/// The EC2 instance a node runs on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRef {
    pub instance_id: String,
    /// Availability Zone or Local Zone from the providerID, when it names one.
    pub zone: Option<String>,
}

/// Why a node is not an EC2 instance we can look up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// No providerID yet; the cloud controller may set it later (the watch picks that up).
    Empty,
    /// An EKS Fargate pod-node.
    Fargate,
    /// An EKS Hybrid Node (`eks-hybrid:///…`), not an EC2 instance.
    Hybrid,
    /// Another cloud or provider (`gce://`, `azure://`, `kind://`, …).
    OtherCloud,
    /// `aws://` but not a well-formed instance reference.
    Malformed,
    /// Another node, created earlier, names the same instance (a duplicate registration).
    Duplicate,
}

impl SkipReason {
    /// Stable name, used in logs and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Empty => "empty_provider_id",
            SkipReason::Fargate => "fargate",
            SkipReason::Hybrid => "hybrid",
            SkipReason::OtherCloud => "other_cloud",
            SkipReason::Malformed => "malformed_provider_id",
            SkipReason::Duplicate => "duplicate_provider_id",
        }
    }

    /// What it means, for an operator (Events, `explain`).
    pub fn explain(self) -> &'static str {
        match self {
            SkipReason::Empty => {
                "the node has no spec.providerID yet (the kubelet or the cloud controller sets it; we look again when it does)"
            }
            SkipReason::Fargate => "an EKS Fargate node: EC2 does not describe its topology",
            SkipReason::Hybrid => "an EKS Hybrid Node, not an EC2 instance",
            SkipReason::OtherCloud => {
                "its providerID is not an AWS one (aws:///<zone>/<instance-id>)"
            }
            SkipReason::Malformed => {
                "its providerID is aws:// but not aws:///<zone>/i-<8 or 17 hex digits> (EC2 would refuse the ID)"
            }
            SkipReason::Duplicate => {
                "another node, created earlier, names the same instance in its providerID (a duplicate registration, broken or hostile): looked at again every minute, labelled once it is the only one"
            }
        }
    }

    pub const ALL: [SkipReason; 6] = [
        SkipReason::Empty,
        SkipReason::Fargate,
        SkipReason::Hybrid,
        SkipReason::OtherCloud,
        SkipReason::Malformed,
        SkipReason::Duplicate,
    ];
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest providerID we look at; anything longer is malformed (and never echoed whole).
const MAX_LEN: usize = 256;

/// Parse a providerID. Total: every input gives an instance or a reason.
pub fn parse(provider_id: &str) -> Result<InstanceRef, SkipReason> {
    parse_borrowed(provider_id).map(|(zone, id)| InstanceRef {
        instance_id: id.to_string(),
        zone: zone.map(str::to_string),
    })
}

/// As [`parse`], the zone (if any) and instance ID borrowed from `provider_id` (a reconcile
/// reads them at every resync: nothing allocated).
pub fn parse_borrowed(provider_id: &str) -> Result<(Option<&str>, &str), SkipReason> {
    let pid = provider_id.trim();
    if pid.is_empty() {
        return Err(SkipReason::Empty);
    }
    if pid.len() > MAX_LEN {
        return Err(SkipReason::Malformed);
    }
    let Some(rest) = pid.strip_prefix("aws://") else {
        if pid.starts_with("eks-hybrid://") {
            return Err(SkipReason::Hybrid);
        }
        return Err(SkipReason::OtherCloud);
    };
    // `aws:///<zone>/<id>`: the authority is empty, then zone and ID segments. Fargate's form is
    // `aws:///<zone>/<hash>/fargate-<ip>.<domain>`.
    let rest = rest.trim_start_matches('/');
    if rest.split('/').any(|s| s.starts_with("fargate-")) {
        return Err(SkipReason::Fargate);
    }
    let mut segments = rest.split('/');
    let (zone, id) = match (segments.next(), segments.next(), segments.next()) {
        (Some(id), None, None) => (None, id),
        (Some(zone), Some(id), None) => (Some(zone), id),
        _ => return Err(SkipReason::Malformed),
    };
    if !is_instance_id(id) {
        return Err(SkipReason::Malformed);
    }
    let zone = match zone {
        None | Some("") => None,
        Some(z) if is_zone_name(z) => Some(z),
        Some(_) => return Err(SkipReason::Malformed),
    };
    Ok((zone, id))
}

/// `i-` followed by 8 (old style) or 17 lowercase hex digits, the only forms EC2 accepts. Any
/// other length would make EC2 refuse the whole call it is in (`InvalidInstanceID.Malformed`),
/// and with it up to 99 good instances.
pub fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn is_zone_name(z: &str) -> bool {
    z.len() <= 64
        && z.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && z.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
}

/// The region of an Availability Zone, Local Zone or Wavelength Zone name:
/// `us-west-2b` → `us-west-2`, `us-west-2-lax-1a` → `us-west-2`, `us-gov-west-1a` → `us-gov-west-1`.
pub fn region_of_zone(zone: &str) -> Option<String> {
    region_of_zone_borrowed(zone).map(str::to_string)
}

/// As [`region_of_zone`], borrowed: a region is the start of its zones' names.
pub fn region_of_zone_borrowed(zone: &str) -> Option<&str> {
    // The first part that starts with a digit, and the bytes before it.
    let mut start = 0;
    let mut numbered = None;
    for (i, part) in zone.split('-').enumerate() {
        if part.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            numbered = Some((i, start, part));
            break;
        }
        start += part.len() + 1;
    }
    let (i, start, part) = numbered?;
    if i < 2 {
        return None;
    }
    let digits = part.bytes().take_while(u8::is_ascii_digit).count();
    let region = zone.get(..start + digits)?;
    is_region_name(region).then_some(region)
}

/// Whether `r` has the shape of an AWS region name: a partition or country code (`us`, `eu`,
/// `eusc`), an optional qualifier (`gov`, `iso`, `isob`, `de`), a direction and a number:
/// `us-west-2`, `us-gov-west-1`, `ap-southeast-3`, `eusc-de-east-1`. The controller keeps one EC2
/// client per region; only names of this shape may create one, so a hostile zone in a
/// providerID cannot make it hold any number of them.
pub fn is_region_name(r: &str) -> bool {
    const DIRECTIONS: [&str; 9] = [
        "north",
        "south",
        "east",
        "west",
        "central",
        "northeast",
        "northwest",
        "southeast",
        "southwest",
    ];
    let letters = |p: &str| (2..=4).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_lowercase());
    let number = |p: &str| (1..=2).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    let mut parts = r.split('-');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some(area), Some(direction), Some(n), None, None) => {
            letters(area) && DIRECTIONS.contains(&direction) && number(n)
        }
        (Some(area), Some(qualifier), Some(direction), Some(n), None) => {
            letters(area) && letters(qualifier) && DIRECTIONS.contains(&direction) && number(n)
        }
        _ => false,
    }
}

/// A providerID shortened for a log line: hostile inputs can be kilobytes long.
pub fn for_log(provider_id: &str) -> String {
    const SHOW: usize = 80;
    if provider_id.chars().count() <= SHOW {
        provider_id.to_string()
    } else {
        let head: String = provider_id.chars().take(SHOW).collect();
        format!("{head}… ({} bytes)", provider_id.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(id: &str, zone: Option<&str>) -> Result<InstanceRef, SkipReason> {
        Ok(InstanceRef {
            instance_id: id.into(),
            zone: zone.map(Into::into),
        })
    }

    #[test]
    fn standard_ec2_provider_ids() {
        assert_eq!(
            parse("aws:///us-west-2a/i-0123456789abcdef0"),
            ok("i-0123456789abcdef0", Some("us-west-2a"))
        );
        assert_eq!(
            parse("aws:///us-east-1b/i-1234abcd"),
            ok("i-1234abcd", Some("us-east-1b"))
        );
    }

    #[test]
    fn local_zone_and_empty_zone() {
        assert_eq!(
            parse("aws:///us-west-2-lax-1a/i-0123456789abcdef0"),
            ok("i-0123456789abcdef0", Some("us-west-2-lax-1a"))
        );
        assert_eq!(
            parse("aws:////i-0123456789abcdef0"),
            ok("i-0123456789abcdef0", None)
        );
        assert_eq!(
            parse("aws:///i-0123456789abcdef0"),
            ok("i-0123456789abcdef0", None)
        );
    }

    #[test]
    fn empty_and_whitespace_are_empty() {
        assert_eq!(parse(""), Err(SkipReason::Empty));
        assert_eq!(parse("   "), Err(SkipReason::Empty));
    }

    #[test]
    fn fargate_hybrid_and_other_clouds_are_skipped_by_kind() {
        assert_eq!(
            parse(
                "aws:///us-east-1b/0123456789abcdef0123456789abcdef/fargate-ip-192-168-1-2.ec2.internal"
            ),
            Err(SkipReason::Fargate)
        );
        assert_eq!(
            parse("aws:///us-east-1b/fargate-ip-10-0-0-1"),
            Err(SkipReason::Fargate)
        );
        assert_eq!(
            parse("eks-hybrid:///us-west-2/my-cluster/mi-0123456789abcdef0"),
            Err(SkipReason::Hybrid)
        );
        for other in [
            "gce://project/us-central1-a/vm-1",
            "azure:///subscriptions/x/resourceGroups/y",
            "kind://docker/kind/kind-worker",
            "i-0123456789abcdef0",
        ] {
            assert_eq!(parse(other), Err(SkipReason::OtherCloud), "{other}");
        }
    }

    #[test]
    fn malformed_aws_ids() {
        for bad in [
            "aws:///",
            "aws:///us-west-2a/",
            "aws:///us-west-2a/i-",
            "aws:///us-west-2a/i-xyz12345",
            "aws:///us-west-2a/i-0123456789ABCDEF0",
            "aws:///us-west-2a/i-0123456789abcdef01",
            "aws:///us-west-2a/i-1234567",
            "aws:///us-west-2a/extra/i-0123456789abcdef0",
            "aws:///US WEST/i-0123456789abcdef0",
            "aws:///us-west-2a/i-0123456789abcdéf0",
            "aws:///ünïcödé/i-0123456789abcdef0",
        ] {
            assert_eq!(parse(bad), Err(SkipReason::Malformed), "{bad}");
        }
        let huge = format!("aws:///us-west-2a/i-{}", "a".repeat(10_000));
        assert_eq!(parse(&huge), Err(SkipReason::Malformed));
    }

    /// EC2 instance IDs have 8 (old style) or 17 hex digits, nothing between: EC2 refuses any
    /// other length with InvalidInstanceID.Malformed, failing the whole call it is in.
    #[test]
    fn only_8_or_17_hex_digits_make_an_instance_id() {
        let digits = "0123456789abcdef0";
        for len in 1..=20 {
            let id = format!("i-{}", &digits.repeat(2)[..len]);
            let pid = format!("aws:///us-west-2a/{id}");
            let want_ok = len == 8 || len == 17;
            assert_eq!(is_instance_id(&id), want_ok, "{id}");
            assert_eq!(parse(&pid).is_ok(), want_ok, "{pid}");
        }
    }

    #[test]
    fn regions_from_zones() {
        assert_eq!(region_of_zone("us-west-2b").as_deref(), Some("us-west-2"));
        assert_eq!(
            region_of_zone("us-west-2-lax-1a").as_deref(),
            Some("us-west-2")
        );
        assert_eq!(
            region_of_zone("us-gov-west-1a").as_deref(),
            Some("us-gov-west-1")
        );
        assert_eq!(
            region_of_zone("ap-northeast-1d").as_deref(),
            Some("ap-northeast-1")
        );
        assert_eq!(
            region_of_zone("us-east-1-wl1-bos-wlz-1").as_deref(),
            Some("us-east-1")
        );
        assert_eq!(region_of_zone("zone"), None);
        assert_eq!(region_of_zone("1a"), None);
        assert_eq!(
            region_of_zone("eusc-de-east-1a").as_deref(),
            Some("eusc-de-east-1")
        );
        assert_eq!(
            region_of_zone("mx-central-1a").as_deref(),
            Some("mx-central-1")
        );
    }

    /// A zone in a providerID is anyone's text: only region-shaped names may come out, so it
    /// cannot make the controller keep a client per invented region.
    #[test]
    fn made_up_zones_give_no_region() {
        for zone in [
            "aa-bb-1a",
            "zz-nowhere-9a",
            "us-west-123a",
            "abcdefg-west-1a",
            "us-x-y-west-1a",
            "x-west-1a",
        ] {
            assert_eq!(region_of_zone(zone), None, "{zone}");
        }
        assert!(is_region_name("us-isob-east-1") && is_region_name("cn-northwest-1"));
        assert!(!is_region_name("us-west-2b") && !is_region_name("us-west"));
    }

    #[test]
    fn log_form_is_bounded() {
        let huge = "x".repeat(10_000);
        assert!(for_log(&huge).len() < 120);
        assert_eq!(for_log("aws:///a/i-1"), "aws:///a/i-1");
    }
}
