//! Every rule family, listed once: the ids it raises, how long its findings live, and the
//! order and cadence the engine runs it in. Above the families (it names each one) and below
//! the engine, so the rules' shared vocabulary in `rules/mod.rs` names none of them.

use super::{RuleInput, sort};
use super::{
    environment, errors, health, memory, pcie, power, thermal, throttle, utilisation, vendor,
};
use gpudiag_model::finding::Finding;

/// When the engine runs a rule family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cadence {
    /// On the tick that brings events (XIDs, lost devices); each event is judged once.
    Events,
    /// On every tick, over the tick's newest samples (telemetry health: a stall lasts a tick).
    EveryTick,
    /// Once, on static facts (driver, persistence, MIG).
    Once,
    /// At most once per `eval_interval_s` of sample time, over windows of the history.
    Windowed,
    /// With the verdicts, from what they concluded (`job::findings` over the job verdicts); the
    /// family's `evaluate` has nothing to add on its own.
    WithVerdicts,
}

/// How long a finding lives once raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Current state: each windowed evaluation judges it again and it holds while it says so.
    Windowed,
    /// Something that happened (an XID, a lost or stalled GPU): it stays raised for the session,
    /// and a report over a span carries it only if it was seen in that span.
    Event,
    /// A fact about the host (driver, persistence, MIG): it stays raised and every report
    /// carries it.
    Fact,
    /// About the work on a GPU over a window rather than the GPU itself: a report over a longer
    /// span judges it again over that span instead of keeping a moment's.
    Workload,
}

impl Lifetime {
    /// Whether a finding stays raised once raised, rather than being judged again.
    pub fn is_sticky(self) -> bool {
        matches!(self, Lifetime::Event | Lifetime::Fact)
    }
}

/// One rule family: its name, the ids it raises, how long they live, when it runs, and the
/// rule itself.
pub struct Family {
    pub name: &'static str,
    /// Every finding id the family raises starts with one of these; where two families'
    /// prefixes both match an id, the longer one owns it (`errors.xid_` is the events').
    pub ids: &'static [&'static str],
    pub lifetime: Lifetime,
    pub cadence: Cadence,
    pub evaluate: fn(&RuleInput<'_>) -> Vec<Finding>,
}

/// Every rule family, listed once: the engine, [`evaluate`] and [`windowed`] all read this
/// table, so a new family is one entry here and one file.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "errors",
        ids: &["errors."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: errors::evaluate,
    },
    Family {
        name: "utilisation",
        ids: &["utilisation."],
        lifetime: Lifetime::Workload,
        cadence: Cadence::Windowed,
        evaluate: utilisation::evaluate,
    },
    Family {
        name: "throttle",
        ids: &["throttle."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: throttle::evaluate,
    },
    Family {
        name: "pcie",
        ids: &["pcie."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: pcie::evaluate,
    },
    Family {
        name: "memory",
        ids: &["memory."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: memory::evaluate,
    },
    Family {
        name: "thermal",
        ids: &["thermal."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: thermal::evaluate,
    },
    Family {
        name: "power",
        ids: &["power."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: power::evaluate,
    },
    Family {
        name: "vendor",
        ids: &["vendor."],
        lifetime: Lifetime::Windowed,
        cadence: Cadence::Windowed,
        evaluate: vendor::evaluate,
    },
    Family {
        name: "errors.events",
        ids: &["errors.xid_"],
        lifetime: Lifetime::Event,
        cadence: Cadence::Events,
        evaluate: errors::evaluate_events,
    },
    Family {
        name: "health",
        ids: &[
            health::LOST,
            health::MISSING,
            health::STALLED,
            health::IMPLAUSIBLE,
        ],
        lifetime: Lifetime::Event,
        cadence: Cadence::EveryTick,
        evaluate: health::evaluate,
    },
    Family {
        name: "environment",
        ids: &["environment."],
        lifetime: Lifetime::Fact,
        cadence: Cadence::Once,
        evaluate: environment::evaluate,
    },
    Family {
        name: "job",
        ids: &["job."],
        lifetime: Lifetime::Workload,
        cadence: Cadence::WithVerdicts,
        evaluate: |_| Vec::new(),
    },
];

/// The family a finding id (or a rule name a not-judged entry carries: an id or a family's
/// name) belongs to: the family so named, else the one whose longest prefix matches it.
pub fn family_of(id: &str) -> Option<&'static Family> {
    if let Some(named) = FAMILIES.iter().find(|f| f.name == id) {
        return Some(named);
    }
    FAMILIES
        .iter()
        .filter_map(|f| {
            let longest = f
                .ids
                .iter()
                .filter(|p| id.starts_with(*p))
                .map(|p| p.len())
                .max();
            longest.map(|len| (len, f))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, f)| f)
}

/// Findings about the work on a GPU rather than the GPU itself: they describe a window, so a
/// report over a longer one judges them again instead of keeping a moment's.
pub fn is_workload(f: &Finding) -> bool {
    lifetime(&f.id) == Lifetime::Workload
}

/// How long a finding with `id` lives: its family's lifetime, or windowed for an id no family
/// raises (a probe's, or one a newer recording carries), judged again like current state.
pub fn lifetime(id: &str) -> Lifetime {
    family_of(id).map_or(Lifetime::Windowed, |f| f.lifetime)
}

/// Runs the families of one cadence, in the table's order.
pub fn run_cadence(cadence: Cadence, input: &RuleInput<'_>) -> Vec<Finding> {
    FAMILIES
        .iter()
        .filter(|f| f.cadence == cadence)
        .flat_map(|f| (f.evaluate)(input))
        .collect()
}

/// Runs every rule family once. Findings come back worst first, then by device.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut findings: Vec<Finding> = FAMILIES.iter().flat_map(|f| (f.evaluate)(input)).collect();
    sort(&mut findings);
    findings
}

/// The families judged over windows of the history (everything but events, health and
/// environment).
pub fn windowed(input: &RuleInput<'_>) -> Vec<Finding> {
    run_cadence(Cadence::Windowed, input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_lives_as_its_family_says() {
        let cases = [
            ("errors.xid_79", "errors.events", Lifetime::Event),
            ("errors.ecc_uncorrectable", "errors", Lifetime::Windowed),
            ("errors.past_xid_13", "errors", Lifetime::Windowed),
            ("device.lost", "health", Lifetime::Event),
            ("telemetry.stalled", "health", Lifetime::Event),
            ("environment.mig_enabled", "environment", Lifetime::Fact),
            ("utilisation.low", "utilisation", Lifetime::Workload),
            ("job.straggler", "job", Lifetime::Workload),
            ("throttle", "throttle", Lifetime::Windowed),
            ("memory.possible_leak", "memory", Lifetime::Windowed),
        ];
        for (id, family, lifetime) in cases {
            assert_eq!(family_of(id).map(|f| f.name), Some(family), "{id}");
            assert_eq!(super::lifetime(id), lifetime, "{id}");
        }
        assert!(family_of("probe.bandwidth_low").is_none());
        assert_eq!(super::lifetime("probe.bandwidth_low"), Lifetime::Windowed);
    }

    #[test]
    fn no_two_families_claim_the_same_ids() {
        let mut seen = std::collections::BTreeMap::new();
        for f in FAMILIES {
            assert!(!f.ids.is_empty(), "{} raises no ids", f.name);
            for p in f.ids {
                if let Some(other) = seen.insert(*p, f.name) {
                    panic!("{p} is claimed by {other} and {}", f.name);
                }
            }
        }
    }
}
