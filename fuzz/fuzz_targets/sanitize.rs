//! Any placement group name: the sanitised value is a valid label value, stable, and the name
//! itself when that was already valid.
#![no_main]
use ec2_topology_core::labels::{is_valid_label_value, sanitize_label_value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    let v = sanitize_label_value(&raw);
    assert!(is_valid_label_value(&v), "{raw:?} -> {v:?}");
    assert_eq!(v, sanitize_label_value(&raw));
    if is_valid_label_value(&raw) {
        assert_eq!(v, raw);
    }
});
