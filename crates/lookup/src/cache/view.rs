//! What the cache holds about one instance, as `explain` shows it.

use super::*;

/// One cache entry, as `explain` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheView {
    /// The boot the answer is about (a new boot ID means a new lookup).
    pub boot_id: Option<String>,
    /// `known`, `settling` (a late field still missing: asked again soon), `not_described` or
    /// `refused` (EC2 refused the ID).
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<InstanceTopology>,
    /// How old the answer is (complete answers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_s: Option<u64>,
    /// When the cache stops answering by itself and EC2 is asked again (at the node's next
    /// reconcile after that).
    pub ask_again_in_s: u64,
    /// Answers in a row that lacked something (not described, refused, or still settling).
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Cache {
    /// What the cache holds about `instance_id` at `now` (for `explain`).
    pub fn inspect(&self, instance_id: &str, now: Instant) -> Option<CacheView> {
        let inner = self.inner();
        let e = inner.entries.get(instance_id)?;
        let secs = |d: Duration| d.as_secs();
        let view = match &e.state {
            State::Known {
                topology,
                refresh_at,
                settling,
                refused,
                ..
            } => CacheView {
                boot_id: e.boot_id.as_ref().map(ToString::to_string),
                state: if refused.is_some() {
                    "refused"
                } else if *settling > 0 {
                    "settling"
                } else {
                    "known"
                }
                .to_string(),
                topology: Some(InstanceTopology {
                    instance_id: instance_id.to_owned(),
                    ..(**topology).clone()
                }),
                // A complete answer is kept for the cache TTL: its age follows from when it is
                // due again.
                age_s: (*settling == 0 && refused.is_none()).then(|| {
                    secs(
                        self.cfg
                            .cache_ttl
                            .saturating_sub(refresh_at.saturating_duration_since(now)),
                    )
                }),
                ask_again_in_s: secs(refresh_at.saturating_duration_since(now)),
                attempts: refused.as_ref().map_or(*settling, |r| r.1),
                refused: refused.as_ref().map(|r| r.0.to_string()),
            },
            State::NotDescribed {
                retry_at,
                attempts,
                refused,
            } => CacheView {
                boot_id: e.boot_id.as_ref().map(ToString::to_string),
                state: if refused.is_some() {
                    "refused"
                } else {
                    "not_described"
                }
                .to_string(),
                topology: None,
                age_s: None,
                ask_again_in_s: secs(retry_at.saturating_duration_since(now)),
                attempts: *attempts,
                refused: refused.as_ref().map(ToString::to_string),
            },
        };
        Some(view)
    }
}
