//! Any topology answer: derived labels are valid Kubernetes labels of our family, and applying
//! the diff then diffing again finds nothing to do.
#![no_main]
use std::collections::BTreeMap;

use ec2_topology_core::{
    labels::{self, LabelScheme, LayerNumbering, is_valid_label_key, is_valid_label_value},
    topology::InstanceTopology,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Fields separated by 0xff, network nodes by 0xfe: an answer of arbitrary strings.
    let mut fields = data.split(|b| *b == 0xff).map(|f| String::from_utf8_lossy(f).into_owned());
    let flags = data.first().copied().unwrap_or(0);
    let nodes: Vec<String> = fields.next().unwrap_or_default().split('\u{fffd}').map(str::to_owned).collect();
    let t = InstanceTopology {
        instance_id: "i-0123456789abcdef0".into(),
        instance_type: None,
        availability_zone: None,
        zone_id: fields.next(),
        network_nodes: nodes.into_iter().filter(|n| !n.is_empty()).collect(),
        group_name: fields.next(),
        capacity_block_id: fields.next(),
    };
    let scheme = LabelScheme {
        numbering: if flags & 1 == 0 { LayerNumbering::TopFirst } else { LayerNumbering::LeafFirst },
        // topograph's tiers are numbered from 0.
        first_layer: usize::from(flags & 2 == 0),
        ..LabelScheme::default()
    };
    if let Ok(d) = labels::desired(&scheme, &t) {
        for (k, v) in &d.labels {
            assert!(is_valid_label_key(k) && is_valid_label_value(v), "{k}={v}");
            assert!(scheme.is_family_label(k));
        }
        let mut node = BTreeMap::new();
        let diff = labels::diff(&scheme, &node, &BTreeMap::new(), &d);
        for (k, v) in &diff.labels.add {
            node.insert(k.clone(), v.clone());
        }
        assert!(labels::diff(&scheme, &node, &BTreeMap::new(), &d).labels.is_empty());
    }
});
