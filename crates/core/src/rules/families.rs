//! Every rule family, listed once, and the order and cadence the engine runs them in. Above the
//! families (it names each one) and below the engine, so the rules' shared vocabulary in
//! `rules/mod.rs` names none of them.

use super::{Finding, RuleInput, sort};
use super::{
    environment, errors, health, memory, pcie, power, thermal, throttle, utilisation, vendor,
};

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
}

/// One rule family: its name, when it runs, and the rule itself.
pub struct Family {
    pub name: &'static str,
    pub cadence: Cadence,
    pub evaluate: fn(&RuleInput<'_>) -> Vec<Finding>,
}

/// Every rule family, listed once: the engine, [`evaluate`] and [`windowed`] all read this
/// table, so a new family is one entry here and one file.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "errors",
        cadence: Cadence::Windowed,
        evaluate: errors::evaluate,
    },
    Family {
        name: "utilisation",
        cadence: Cadence::Windowed,
        evaluate: utilisation::evaluate,
    },
    Family {
        name: "throttle",
        cadence: Cadence::Windowed,
        evaluate: throttle::evaluate,
    },
    Family {
        name: "pcie",
        cadence: Cadence::Windowed,
        evaluate: pcie::evaluate,
    },
    Family {
        name: "memory",
        cadence: Cadence::Windowed,
        evaluate: memory::evaluate,
    },
    Family {
        name: "thermal",
        cadence: Cadence::Windowed,
        evaluate: thermal::evaluate,
    },
    Family {
        name: "power",
        cadence: Cadence::Windowed,
        evaluate: power::evaluate,
    },
    Family {
        name: "vendor",
        cadence: Cadence::Windowed,
        evaluate: vendor::evaluate,
    },
    Family {
        name: "errors.events",
        cadence: Cadence::Events,
        evaluate: errors::evaluate_events,
    },
    Family {
        name: "health",
        cadence: Cadence::EveryTick,
        evaluate: health::evaluate,
    },
    Family {
        name: "environment",
        cadence: Cadence::Once,
        evaluate: environment::evaluate,
    },
];

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
