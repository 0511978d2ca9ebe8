//! A first count of what the collectors sent, for the line `run --kernels` prints until the
//! kernels report replaces it.

use std::collections::{BTreeMap, BTreeSet};

use gpudiag_model::kernels::{CollectorLosses, CollectorMessage};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub processes: BTreeSet<u32>,
    pub kernels: u64,
    pub copies: u64,
    pub sets: u64,
    pub syncs: u64,
    /// Each process's latest cumulative losses.
    pub losses: BTreeMap<u32, CollectorLosses>,
    pub stepped_aside: u64,
    /// Why a process's collector could not record, by pid.
    pub cannot_record: BTreeMap<u32, String>,
    pub goodbyes: u64,
    /// The GPUs the processes used: CUDA ordinal and UUID (`None`: not resolved).
    pub devices: BTreeSet<(u32, Option<String>)>,
    /// Which CUPTI the processes recorded with: API version and where it came from.
    pub cupti: BTreeSet<(u32, String)>,
}

impl Tally {
    pub fn add(&mut self, message: &CollectorMessage) {
        self.processes.insert(message.pid());
        match message {
            CollectorMessage::Kernels { records, .. } => self.kernels += records.len() as u64,
            CollectorMessage::Copies { records, .. } => self.copies += records.len() as u64,
            CollectorMessage::Sets { records, .. } => self.sets += records.len() as u64,
            CollectorMessage::Syncs { records, .. } => self.syncs += records.len() as u64,
            CollectorMessage::Losses { pid, losses } => {
                self.losses.insert(*pid, *losses);
            }
            CollectorMessage::SteppedAside { .. } => self.stepped_aside += 1,
            CollectorMessage::Window { .. } => {}
            CollectorMessage::CannotRecord { pid, why } => {
                self.cannot_record.insert(*pid, why.clone());
            }
            CollectorMessage::Goodbye { .. } => self.goodbyes += 1,
            CollectorMessage::Hello(hello) => {
                self.cupti
                    .insert((hello.cupti_api_version, hello.cupti_source.clone()));
            }
            CollectorMessage::Device { device, .. } => {
                self.devices.insert((device.ordinal, device.uuid.clone()));
            }
        }
    }

    /// Losses summed over processes.
    pub fn total_losses(&self) -> CollectorLosses {
        self.losses
            .values()
            .fold(CollectorLosses::default(), |a, l| CollectorLosses {
                cupti_dropped: a.cupti_dropped + l.cupti_dropped,
                send_dropped: a.send_dropped + l.send_dropped,
                names_cut: a.names_cut + l.names_cut,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::kernels::ClockPair;

    #[test]
    fn records_are_counted_and_losses_kept_latest_per_process() {
        let clock = ClockPair {
            cupti_ns: 0,
            unix_ns: 0,
        };
        let mut t = Tally::default();
        t.add(&CollectorMessage::Syncs {
            pid: 7,
            clock,
            records: Vec::new(),
        });
        let losses = |n| CollectorLosses {
            cupti_dropped: n,
            send_dropped: 1,
            names_cut: 0,
        };
        t.add(&CollectorMessage::Losses {
            pid: 7,
            losses: losses(3),
        });
        t.add(&CollectorMessage::Losses {
            pid: 7,
            losses: losses(5),
        });
        t.add(&CollectorMessage::Losses {
            pid: 8,
            losses: losses(1),
        });
        assert_eq!(t.total_losses().cupti_dropped, 6);
        assert_eq!(t.total_losses().send_dropped, 2);
        assert_eq!(t.processes.len(), 2);
    }
}
