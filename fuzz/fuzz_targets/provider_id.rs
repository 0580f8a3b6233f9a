//! Any providerID: parsing never panics, and what it accepts is a well-formed instance.
#![no_main]
use ec2_topology_core::provider_id;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(i) = provider_id::parse(&text) {
        assert!(provider_id::is_instance_id(&i.instance_id));
        if let Some(zone) = &i.zone {
            let _ = provider_id::region_of_zone(zone);
        }
    }
    assert!(provider_id::for_log(&text).len() < 400);
});
