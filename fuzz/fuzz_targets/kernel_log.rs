//! Kernel logs (`GPUDIAG_KMSG_PATH`, or what /dev/kmsg holds): every line parsed as a record, a
//! `dmesg` line or a bare message, its XIDs placed on two GPUs (one healthy, one lost) and
//! judged. Nothing may panic; an XID that parses must print and parse back to itself, and every
//! finding must have the shape the check report's schema asks for.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

use gpudiag_core::rules::errors::past_xids;
use gpudiag_telemetry::kernel_log::{PciAddress, parse_line, parse_xid, xids_in};
use gpudiag_telemetry::sanity;
use gpudiag_model::sample::{Absent, DeviceInfo, Sample};

fn gpu(index: u32, bus: &str) -> DeviceInfo {
    DeviceInfo {
        index,
        pci_bus_id: Some(bus.into()),
        ..DeviceInfo::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lines: Vec<_> = text.lines().map(parse_line).collect();
    for l in &lines {
        let Some((pci, xid)) = parse_xid(&l.text) else {
            continue;
        };
        assert_eq!(PciAddress::parse(&pci.to_string()), Some(pci), "{pci}");
        let again = format!("NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=x, y");
        assert_eq!(parse_xid(&again), Some((pci, xid)), "{}", l.text);
    }
    let xids = xids_in(lines, Some(1_767_225_600_000));
    let devices = [gpu(0, "00000000:19:00.0"), gpu(1, "00000000:3B:00.0")];
    let mut pending = Sample::new(0, 1_767_229_200_000);
    pending.remapped_rows_pending = Some(true);
    let latest = BTreeMap::from([
        (0, pending),
        (
            1,
            sanity::all_absent(1, 1_767_229_200_000, &Absent::GpuLost),
        ),
    ]);
    let log = Ok(gpudiag_telemetry::kernel_log::XidLog {
        source: "fuzz".into(),
        xids,
        boot_ms: Some(1_767_225_600_000),
        truncated: None,
    });
    let (findings, _) = past_xids(
        &log,
        &devices,
        &[0, 1],
        &latest,
        1_767_229_200_000,
        "before",
    );
    for f in findings {
        assert!(f.id.starts_with("errors.past_xid_"), "{}", f.id);
        assert!(!f.title.is_empty() && !f.advice.is_empty());
        serde_json::to_string(&f).expect("a finding serialises");
    }
});
