//! Any annotation value: reading a verification record never panics; a record opened with a key
//! is one that key sealed (it encodes back to a value the key opens, to the same record), and a
//! record sealed with one key is never opened by another. Any record made of the input opens
//! under the key that sealed it (alone, or as the previous key after a rotation) and under no
//! other.
#![no_main]
use ec2_topology_core::{
    topology::InstanceTopology,
    verified::{RecordKey, Verified},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (Ok(ours), Ok(theirs)) = (
        RecordKey::new(b"the controller's key: thirty-two bytes or more"),
        RecordKey::new(b"somebody else's key, also thirty-two bytes long"),
    ) else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    // The input as an annotation value.
    let _ = Verified::parse(&text);
    if let Ok(v) = Verified::open(&text, &ours) {
        assert!(Verified::open(&text, &theirs).is_err(), "opened by two keys");
        assert_eq!(Verified::open(&v.encode(&ours), &ours).as_ref(), Ok(&v));
    }
    // A record made of the input, sealed with our key.
    let mut parts = text.split('\u{1}');
    let v = Verified {
        topology: InstanceTopology {
            instance_id: parts.next().unwrap_or_default().to_string(),
            instance_type: parts.next().map(str::to_owned),
            availability_zone: None,
            zone_id: parts.next().map(str::to_owned),
            network_nodes: parts.next().unwrap_or_default().split(',').map(str::to_owned).collect(),
            group_name: parts.next().map(str::to_owned),
            capacity_block_id: parts.next().map(str::to_owned),
        },
        boot_id: parts.next().map(str::to_owned),
        at: data.len() as u64,
    };
    let sealed = v.encode(&ours);
    assert_eq!(Verified::open(&sealed, &ours).as_ref(), Ok(&v), "round trip");
    assert!(Verified::open(&sealed, &theirs).is_err(), "a wrong key is refused");
    // After a rotation to `theirs`, holding ours as previous: still opened, to the same record.
    let rotated = theirs.clone().with_previous([ours.clone()]);
    assert_eq!(Verified::open(&sealed, &rotated).as_ref(), Ok(&v), "opened after a rotation");
    // Any one byte changed is refused (or is not a record at all).
    if !sealed.is_empty() {
        let mut bytes = sealed.clone().into_bytes();
        let at = data.first().map_or(0, |b| usize::from(*b)) % bytes.len();
        bytes[at] ^= 0x01;
        if let Ok(edited) = String::from_utf8(bytes) {
            if edited != sealed {
                if let Ok(o) = Verified::open(&edited, &ours) {
                    // Only an edit JSON reads the same (an escape spelled otherwise) may open.
                    assert_eq!(o, v, "an edited record opened as another");
                }
            }
        }
    }
});
