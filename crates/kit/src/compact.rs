//! Compact forms of the identifiers kept for every node, twice over (the node cache's
//! verification record and the EC2 answer cache each hold one per node: 100,000 of each at
//! scale). A leaf: it imports nothing of ours.
//!
//! - [`InstanceId`]: an EC2 instance ID (`i-` and 17 hex digits) fits inline (24 bytes, no
//!   allocation; a `Box<str>` of it is 16 bytes and a 32-byte allocation).
//! - [`BootId`]: the kubelet's boot ID is the kernel's `/proc/sys/kernel/random/boot_id`, a
//!   lowercase hyphenated UUID: kept as its 16 bytes (a `Box<str>` of it is 16 bytes and a
//!   48-byte allocation). Any other text is kept as it is, and reads back as it was.

use std::fmt;

/// An EC2 instance ID, inline when short (every instance ID is).
pub type InstanceId = compact_str::CompactString;

/// A node's boot ID (`status.nodeInfo.bootID`), as it was written.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum BootId {
    /// The canonical text of this UUID (lowercase, hyphenated).
    Uuid(uuid::Uuid),
    /// Anything else, as it is.
    Text(Box<str>),
}

impl BootId {
    pub fn new(text: &str) -> Self {
        match canonical_uuid(text) {
            Some(bytes) => Self::Uuid(uuid::Uuid::from_bytes(bytes)),
            None => Self::Text(text.into()),
        }
    }

    /// Whether this is the boot ID `text`.
    pub fn is(&self, text: &str) -> bool {
        match self {
            Self::Uuid(u) => {
                u.hyphenated()
                    .encode_lower(&mut uuid::Uuid::encode_buffer())
                    == text
            }
            Self::Text(t) => &**t == text,
        }
    }
}

/// The 16 bytes of `text` when it is a UUID in its canonical text (lowercase, hyphenated: a
/// Kubernetes UID, a kernel boot ID), which [`uuid_text`] reads back exactly; `None` for any
/// other text.
pub fn canonical_uuid(text: &str) -> Option<[u8; 16]> {
    uuid::Uuid::try_parse(text)
        .ok()
        .filter(|u| {
            u.hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer())
                == text
        })
        .map(uuid::Uuid::into_bytes)
}

/// The canonical text of the UUID `bytes` (see [`canonical_uuid`]).
pub fn uuid_text(bytes: [u8; 16]) -> String {
    // Encoded into a buffer of its length: one allocation (`to_string` grows one as it writes).
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::from_bytes(bytes)
        .hyphenated()
        .encode_lower(&mut buf)
        .to_owned()
}

impl From<&str> for BootId {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl fmt::Display for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uuid(u) => fmt::Display::fmt(&u.hyphenated(), f),
            Self::Text(t) => f.write_str(t),
        }
    }
}

impl fmt::Debug for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_canonical_uuid_is_kept_as_bytes_and_it_reads_back_exactly() {
        let text = "5d3c2b1a-0f9e-4d8c-b7a6-123456789abc";
        let bytes = canonical_uuid(text).expect("a canonical UUID");
        assert_eq!(uuid_text(bytes), text);
        for other in [
            "5D3C2B1A-0F9E-4D8C-B7A6-123456789ABC",
            "5d3c2b1a0f9e4d8cb7a6123456789abc",
            "{5d3c2b1a-0f9e-4d8c-b7a6-123456789abc}",
            "not-a-uuid",
            "",
        ] {
            assert_eq!(canonical_uuid(other), None, "{other}");
        }
    }

    #[test]
    fn a_kernel_boot_id_is_kept_as_16_bytes_and_reads_back_as_written() {
        let text = "5d3c2b1a-0f9e-4d8c-b7a6-123456789abc";
        let id = BootId::new(text);
        assert!(matches!(id, BootId::Uuid(_)), "{id:?}");
        assert_eq!(id.to_string(), text);
        assert!(id.is(text));
        assert!(!id.is("5d3c2b1a-0f9e-4d8c-b7a6-123456789abd"));
    }

    #[test]
    fn other_text_is_kept_as_it_is() {
        // Uppercase, unhyphenated and braced UUIDs parse, but would not read back as written.
        for text in [
            "5D3C2B1A-0F9E-4D8C-B7A6-123456789ABC",
            "5d3c2b1a0f9e4d8cb7a6123456789abc",
            "{5d3c2b1a-0f9e-4d8c-b7a6-123456789abc}",
            "not-a-uuid",
            "",
        ] {
            let id = BootId::new(text);
            assert!(matches!(id, BootId::Text(_)), "{text}: {id:?}");
            assert_eq!(id.to_string(), text);
            assert!(id.is(text));
        }
        assert_ne!(BootId::new("a"), BootId::new("b"));
    }

    #[test]
    fn kept_smaller_than_the_boxed_text() {
        // Two per node (the cache's record and the answer cache): what the change is for.
        assert!(std::mem::size_of::<Option<BootId>>() <= 24);
        assert!(std::mem::size_of::<InstanceId>() <= 24);
        assert!(!InstanceId::from("i-0123456789abcdef0").is_heap_allocated());
    }
}
