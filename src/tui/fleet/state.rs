//! What the fleet UI shows and where the user is in it. Keys and the worker's reports change it
//! through pure functions that return what to ask the worker, so every step is testable without
//! a terminal or a Prometheus; the draw functions only read it.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use gpudiag_fleet::model::{Alert, Fleet, Gpu, GpuVerdict, Node, NodeDetail};

use super::worker::{Report, Request};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    Fleet,
    Node(String),
    Job(String),
    Alerts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    Node,
    Job,
}

/// One line of the fleet table; indices point into the current `Fleet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    Node {
        node: usize,
    },
    /// A GPU; `job` is the job group it is listed under when grouped by job.
    Gpu {
        node: usize,
        gpu: usize,
        job: Option<usize>,
    },
    /// A firing alert under its node (`gpu: None`) or GPU.
    Alert {
        node: usize,
        gpu: Option<usize>,
        alert: usize,
    },
    Job {
        job: usize,
    },
    /// A GPU of a job that the fleet's nodes do not list (its node stopped reporting it).
    JobGpuOnly {
        job: usize,
        index: usize,
    },
    /// The group of GPUs that belong to no job of two or more GPUs.
    NoJob {
        gpus: usize,
    },
}

/// Lines above and below the table: the header's three, the column titles, the footer.
pub const CHROME_ROWS: u16 = 5;

#[derive(Debug)]
pub struct State {
    /// The Prometheus URL, without credentials.
    pub prometheus: String,
    pub interval: Duration,
    pub view: View,
    back: Vec<View>,
    pub grouping: Grouping,
    /// Nodes opened into a line per GPU.
    pub expanded: BTreeSet<String>,
    /// Job groups folded to their one line.
    pub collapsed_jobs: BTreeSet<String>,
    pub filter: String,
    pub typing_filter: bool,
    /// The last fleet read that worked: a failed read leaves it on screen.
    pub fleet: Option<Fleet>,
    /// Wall time (ms) the shown fleet arrived.
    pub fleet_received_ms: Option<i64>,
    /// The open node's charts and processes, once they arrive.
    pub detail: Option<NodeDetail>,
    /// Why the last read failed; cleared by the next good one.
    pub error: Option<String>,
    /// Wall time (ms) the read in flight began.
    pub reading_since_ms: Option<i64>,
    /// A short note for the footer (e.g. a GPU without a job for `J`).
    pub notice: Option<String>,
    /// Wall time in ms, set by the loop before each draw, so ages are drawn against it.
    pub now_ms: i64,
    pub show_help: bool,
    pub quit: bool,
    /// Terminal size, for paging and keeping the selection in view.
    pub viewport: (u16, u16),
    rows: Vec<Row>,
    pub selected: usize,
    /// First table row drawn.
    pub offset: usize,
    /// First line drawn in the node, job and alerts views.
    pub scroll: usize,
    /// The selected line of the alerts view.
    pub alert_selected: usize,
}

impl State {
    pub fn new(prometheus: String, interval: Duration) -> State {
        State {
            prometheus,
            interval,
            view: View::Fleet,
            back: Vec::new(),
            grouping: Grouping::Node,
            expanded: BTreeSet::new(),
            collapsed_jobs: BTreeSet::new(),
            filter: String::new(),
            typing_filter: false,
            fleet: None,
            fleet_received_ms: None,
            detail: None,
            error: None,
            reading_since_ms: None,
            notice: None,
            now_ms: 0,
            show_help: false,
            quit: false,
            viewport: (80, 24),
            rows: Vec::new(),
            selected: 0,
            offset: 0,
            scroll: 0,
            alert_selected: 0,
        }
    }

    /// The fleet table's lines as filtered, grouped and expanded now.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Table lines that fit on the screen.
    pub fn page(&self) -> usize {
        usize::from(self.viewport.1.saturating_sub(CHROME_ROWS)).max(1)
    }

    /// Applies a report from the worker; returns what to ask it next.
    pub fn on_report(&mut self, report: Report) -> Option<Request> {
        match report {
            Report::ReadStarted => {
                self.reading_since_ms = Some(self.now_ms);
                None
            }
            Report::Fleet(fleet) => {
                self.reading_since_ms = None;
                self.on_fleet(*fleet)
            }
            Report::Node(detail) => {
                // A node left before its detail came: keep nothing of it.
                if self.view == View::Node(detail.node.clone()) {
                    self.detail = Some(*detail);
                }
                None
            }
        }
    }

    /// A new fleet read: shown when it worked, else its reason becomes the error line over
    /// the last good one. While a node is open its detail is read again at the new instant.
    pub fn on_fleet(&mut self, fleet: Fleet) -> Option<Request> {
        if let Some(why) = &fleet.could_not_run {
            self.error = Some(why.clone());
            if self.fleet.is_some() {
                return None;
            }
            // Nothing good yet: keep what the failed read says (its URL, its cost) for the
            // header, with no nodes to draw.
        } else {
            self.error = None;
        }
        let keep = self.selected_key();
        self.fleet = Some(fleet);
        self.fleet_received_ms = Some(self.now_ms);
        self.rebuild();
        self.select_key(keep);
        self.node_request()
    }

    /// The request for the open node's detail at the shown fleet's instant.
    fn node_request(&self) -> Option<Request> {
        let View::Node(name) = &self.view else {
            return None;
        };
        let fleet = self.fleet.as_ref()?;
        let node = fleet.node(name)?;
        Some(Request::Node {
            node: Box::new(node.clone()),
            at_ms: fleet.evaluated_at_ms,
        })
    }

    /// Applies a key; returns what to ask the worker.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Request> {
        self.notice = None;
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c')) {
            self.quit = true;
            return None;
        }
        if self.show_help {
            self.show_help = false;
            return None;
        }
        if self.typing_filter {
            self.type_filter(key.code);
            return None;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') | KeyCode::F(1) => self.show_help = true,
            KeyCode::Char('r') => return Some(Request::RefreshNow),
            KeyCode::Char('a') if self.view != View::Alerts => {
                self.open(View::Alerts);
                self.alert_selected = 0;
            }
            KeyCode::Esc => self.go_back(),
            _ => {
                return match self.view.clone() {
                    View::Fleet => self.fleet_key(key.code),
                    View::Alerts => self.alerts_key(key.code),
                    View::Node(_) | View::Job(_) => {
                        self.scroll_key(key.code);
                        None
                    }
                };
            }
        }
        None
    }

    fn type_filter(&mut self, code: KeyCode) {
        match code {
            KeyCode::Enter => self.typing_filter = false,
            KeyCode::Esc => {
                self.typing_filter = false;
                self.set_filter(String::new());
            }
            KeyCode::Backspace => {
                let mut f = self.filter.clone();
                f.pop();
                self.set_filter(f);
            }
            KeyCode::Char(c) if !c.is_control() => {
                let mut f = self.filter.clone();
                f.push(c);
                self.set_filter(f);
            }
            _ => {}
        }
    }

    fn set_filter(&mut self, filter: String) {
        let keep = self.selected_key();
        self.filter = filter;
        self.rebuild();
        self.select_key(keep);
    }

    fn go_back(&mut self) {
        if let Some(previous) = self.back.pop() {
            self.view = previous;
            self.scroll = 0;
            self.detail = None;
        } else if !self.filter.is_empty() {
            self.set_filter(String::new());
        }
    }

    fn open(&mut self, view: View) {
        if self.view == view {
            return;
        }
        self.back.push(std::mem::replace(&mut self.view, view));
        self.scroll = 0;
        self.detail = None;
    }

    fn open_node(&mut self, name: String) -> Option<Request> {
        self.open(View::Node(name));
        self.node_request()
    }

    fn fleet_key(&mut self, code: KeyCode) -> Option<Request> {
        match code {
            KeyCode::Char('/') => self.typing_filter = true,
            KeyCode::Char('g') => {
                self.grouping = match self.grouping {
                    Grouping::Node => Grouping::Job,
                    Grouping::Job => Grouping::Node,
                };
                self.rebuild();
                self.selected = 0;
                self.offset = 0;
            }
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-(self.page() as isize)),
            KeyCode::PageDown => self.move_by(self.page() as isize),
            KeyCode::Home => self.move_by(isize::MIN / 2),
            KeyCode::End => self.move_by(isize::MAX / 2),
            KeyCode::Right | KeyCode::Char(' ') | KeyCode::Char('l') => self.fold(true),
            KeyCode::Left | KeyCode::Char('h') => self.fold(false),
            KeyCode::Char('E') => self.expand_all(),
            KeyCode::Enter => return self.enter(),
            KeyCode::Char('J') => return self.open_job_of_selected(),
            _ => {}
        }
        None
    }

    fn alerts_key(&mut self, code: KeyCode) -> Option<Request> {
        let count = self.alert_list().len();
        match code {
            KeyCode::Up | KeyCode::Char('k') => {
                self.alert_selected = self.alert_selected.saturating_sub(1);
            }
            KeyCode::Down | KeyCode::Char('j') => {
                self.alert_selected = (self.alert_selected + 1).min(count.saturating_sub(1));
            }
            KeyCode::Enter => {
                let node = self
                    .alert_list()
                    .get(self.alert_selected)
                    .and_then(|a| a.node.map(|n| n.name.clone()));
                if let Some(name) = node {
                    return self.open_node(name);
                }
                self.notice = Some("this alert names no node of the fleet".to_owned());
            }
            _ => {}
        }
        None
    }

    fn scroll_key(&mut self, code: KeyCode) {
        let page = self.page();
        match code {
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll += 1,
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(page),
            KeyCode::PageDown => self.scroll += page,
            KeyCode::Home => self.scroll = 0,
            _ => {}
        }
    }

    fn move_by(&mut self, delta: isize) {
        if self.rows.is_empty() {
            self.selected = 0;
            return;
        }
        let last = self.rows.len() - 1;
        self.selected = self.selected.saturating_add_signed(delta).min(last);
        self.keep_selection_in_view();
    }

    fn keep_selection_in_view(&mut self) {
        let page = self.page();
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + page {
            self.offset = self.selected + 1 - page;
        }
        let max_offset = self.rows.len().saturating_sub(page);
        self.offset = self.offset.min(max_offset);
    }

    /// Opens (`true`) or folds the selected node or job group.
    fn fold(&mut self, open: bool) {
        let Some(fleet) = &self.fleet else { return };
        let Some(&row) = self.rows.get(self.selected) else {
            return;
        };
        match row {
            Row::Node { node } => {
                let name = fleet.nodes[node].name.clone();
                if open {
                    self.expanded.insert(name);
                } else {
                    self.expanded.remove(&name);
                }
            }
            Row::Gpu {
                node, job: None, ..
            }
            | Row::Alert { node, .. }
                if !open && self.grouping == Grouping::Node =>
            {
                let name = fleet.nodes[node].name.clone();
                self.expanded.remove(&name);
                self.rebuild();
                self.select_key(Some(format!("n:{name}")));
                return;
            }
            Row::Job { job } => {
                let key = fleet.jobs[job].job_key.clone();
                if open {
                    self.collapsed_jobs.remove(&key);
                } else {
                    self.collapsed_jobs.insert(key);
                }
            }
            Row::Gpu { job: Some(job), .. } | Row::JobGpuOnly { job, .. } if !open => {
                let key = fleet.jobs[job].job_key.clone();
                self.collapsed_jobs.insert(key.clone());
                self.rebuild();
                self.select_key(Some(format!("j:{key}")));
                return;
            }
            _ => return,
        }
        let keep = self.selected_key();
        self.rebuild();
        self.select_key(keep);
    }

    fn expand_all(&mut self) {
        let Some(fleet) = &self.fleet else { return };
        if self.expanded.len() >= fleet.nodes.len() {
            self.expanded.clear();
        } else {
            self.expanded = fleet.nodes.iter().map(|n| n.name.clone()).collect();
        }
        let keep = self.selected_key();
        self.rebuild();
        self.select_key(keep);
    }

    fn enter(&mut self) -> Option<Request> {
        let fleet = self.fleet.as_ref()?;
        let row = *self.rows.get(self.selected)?;
        match row {
            Row::Node { node } | Row::Gpu { node, .. } | Row::Alert { node, .. } => {
                let name = fleet.nodes[node].name.clone();
                self.open_node(name)
            }
            Row::Job { job } => {
                let key = fleet.jobs[job].job_key.clone();
                self.open(View::Job(key));
                None
            }
            Row::JobGpuOnly { job, index } => {
                let name = fleet.jobs[job].gpus[index].node.clone();
                self.open_node(name)
            }
            Row::NoJob { .. } => None,
        }
    }

    fn open_job_of_selected(&mut self) -> Option<Request> {
        let fleet = self.fleet.as_ref()?;
        let row = *self.rows.get(self.selected)?;
        let key = match row {
            Row::Job { job } | Row::Gpu { job: Some(job), .. } | Row::JobGpuOnly { job, .. } => {
                Some(fleet.jobs[job].job_key.clone())
            }
            Row::Gpu { node, gpu, .. } => {
                let gpu = &fleet.nodes[node].gpus[gpu];
                gpu_job(fleet, gpu).map(|j| fleet.jobs[j].job_key.clone())
            }
            _ => None,
        };
        match key {
            Some(key) => self.open(View::Job(key)),
            None => {
                self.notice = Some("no job of two or more GPUs on this line".to_owned());
            }
        }
        None
    }

    /// A stable name for the selected row, to find it again after the rows are rebuilt.
    fn selected_key(&self) -> Option<String> {
        let fleet = self.fleet.as_ref()?;
        let row = self.rows.get(self.selected)?;
        Some(row_key(fleet, row))
    }

    fn select_key(&mut self, key: Option<String>) {
        let found = key.and_then(|key| {
            let fleet = self.fleet.as_ref()?;
            self.rows.iter().position(|r| row_key(fleet, r) == key)
        });
        self.selected = found.unwrap_or(self.selected.min(self.rows.len().saturating_sub(1)));
        self.keep_selection_in_view();
    }

    /// Rebuilds the table's lines from the fleet, the grouping, the filter and what is open.
    pub fn rebuild(&mut self) {
        self.rows = match &self.fleet {
            None => Vec::new(),
            Some(fleet) => {
                let filter = self.filter.to_lowercase();
                match self.grouping {
                    Grouping::Node => node_rows(fleet, &filter, &self.expanded),
                    Grouping::Job => job_rows(fleet, &filter, &self.collapsed_jobs),
                }
            }
        };
    }

    /// Every firing alert with where it belongs, placed ones first in table order.
    pub fn alert_list(&self) -> Vec<PlacedAlert<'_>> {
        let Some(fleet) = &self.fleet else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for node in &fleet.nodes {
            for alert in &node.alerts {
                out.push(PlacedAlert {
                    node: Some(node),
                    gpu: None,
                    alert,
                });
            }
            for gpu in &node.gpus {
                for alert in &gpu.alerts {
                    out.push(PlacedAlert {
                        node: Some(node),
                        gpu: Some(gpu),
                        alert,
                    });
                }
            }
        }
        out.extend(fleet.unplaced_alerts.iter().map(|alert| PlacedAlert {
            node: None,
            gpu: None,
            alert,
        }));
        out
    }

    /// Sets the state as a test or a screenshot wants it: a fleet received `age_ms` ago.
    pub fn with_fleet(mut self, fleet: Fleet, age_ms: i64) -> State {
        self.now_ms = fleet.evaluated_at_ms;
        self.on_fleet(fleet);
        self.now_ms += age_ms;
        self
    }
}

/// An alert and the node and GPU it sits under.
#[derive(Debug, Clone, Copy)]
pub struct PlacedAlert<'a> {
    pub node: Option<&'a Node>,
    pub gpu: Option<&'a Gpu>,
    pub alert: &'a Alert,
}

/// The job of two or more GPUs a GPU works for, as an index into `fleet.jobs`.
pub fn gpu_job(fleet: &Fleet, gpu: &Gpu) -> Option<usize> {
    gpu.jobs
        .iter()
        .map(|j| j.job_key.as_str())
        .chain(gpu.pod.as_ref().map(|p| p.pod.as_str()))
        .find_map(|key| fleet.jobs.iter().position(|j| j.job_key == key))
}

fn row_key(fleet: &Fleet, row: &Row) -> String {
    let gpu_name = |node: usize, gpu: usize| {
        let g = &fleet.nodes[node].gpus[gpu];
        format!(
            "{}:{}",
            fleet.nodes[node].name,
            g.uuid.as_deref().or(g.gpu.as_deref()).unwrap_or_default()
        )
    };
    match *row {
        Row::Node { node } => format!("n:{}", fleet.nodes[node].name),
        Row::Gpu { node, gpu, job } => format!("g:{job:?}:{}", gpu_name(node, gpu)),
        Row::Alert { node, gpu, alert } => format!("a:{node}:{gpu:?}:{alert}"),
        Row::Job { job } => format!("j:{}", fleet.jobs[job].job_key),
        Row::JobGpuOnly { job, index } => format!("o:{job}:{index}"),
        Row::NoJob { .. } => "nojob".to_owned(),
    }
}

fn has(haystack: &str, needle: &str) -> bool {
    haystack.to_lowercase().contains(needle)
}

/// The verdict as the table words it.
pub fn verdict_text(verdict: &GpuVerdict) -> &str {
    match verdict {
        GpuVerdict::Judged { bottleneck, .. } => bottleneck,
        GpuVerdict::NotJudgedYet => "not judged yet",
        GpuVerdict::DcgmExporterOnly => "n/a: dcgm-exporter only",
    }
}

/// Whether the filter (lower case) matches something the GPU's line shows or names.
pub fn gpu_matches(gpu: &Gpu, filter: &str) -> bool {
    let fields = [
        gpu.model.as_deref(),
        gpu.uuid.as_deref(),
        Some(verdict_text(&gpu.verdict)),
        gpu.pod.as_ref().map(|p| p.pod.as_str()),
        gpu.pod.as_ref().and_then(|p| p.namespace.as_deref()),
    ];
    fields.into_iter().flatten().any(|f| has(f, filter))
        || gpu.findings.iter().any(|f| has(&f.id, filter))
        || gpu.alerts.iter().any(|a| has(&a.name, filter))
        || gpu.jobs.iter().any(|j| {
            has(&j.job_key, filter) || j.slurm_job.as_deref().is_some_and(|s| has(s, filter))
        })
}

fn node_matches(node: &Node, filter: &str) -> bool {
    has(&node.name, filter)
        || node.findings.iter().any(|f| has(&f.id, filter))
        || node.alerts.iter().any(|a| has(&a.name, filter))
        || (node.state == gpudiag_fleet::model::NodeState::Down && has("down", filter))
}

fn node_rows(fleet: &Fleet, filter: &str, expanded: &BTreeSet<String>) -> Vec<Row> {
    let mut rows = Vec::new();
    for (ni, node) in fleet.nodes.iter().enumerate() {
        let whole = filter.is_empty() || node_matches(node, filter);
        let matching: Vec<usize> = node
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| !whole && gpu_matches(g, filter))
            .map(|(i, _)| i)
            .collect();
        if !whole && matching.is_empty() {
            continue;
        }
        rows.push(Row::Node { node: ni });
        rows.extend((0..node.alerts.len()).map(|alert| Row::Alert {
            node: ni,
            gpu: None,
            alert,
        }));
        // A node found through its GPUs shows those GPUs without being opened.
        let shown: Vec<usize> = if expanded.contains(&node.name) {
            (0..node.gpus.len())
                .filter(|i| whole || matching.contains(i))
                .collect()
        } else {
            matching
        };
        for gi in shown {
            push_gpu(&mut rows, fleet, ni, gi, None);
        }
    }
    rows
}

fn push_gpu(rows: &mut Vec<Row>, fleet: &Fleet, node: usize, gpu: usize, job: Option<usize>) {
    rows.push(Row::Gpu { node, gpu, job });
    let alerts = fleet.nodes[node].gpus[gpu].alerts.len();
    rows.extend((0..alerts).map(|alert| Row::Alert {
        node,
        gpu: Some(gpu),
        alert,
    }));
}

fn job_rows(fleet: &Fleet, filter: &str, collapsed: &BTreeSet<String>) -> Vec<Row> {
    let mut by_uuid: HashMap<(&str, &str), (usize, usize)> = HashMap::new();
    for (ni, node) in fleet.nodes.iter().enumerate() {
        for (gi, gpu) in node.gpus.iter().enumerate() {
            if let Some(uuid) = &gpu.uuid {
                by_uuid.insert((node.name.as_str(), uuid.as_str()), (ni, gi));
            }
        }
    }
    let mut in_a_job: Vec<Vec<bool>> = fleet
        .nodes
        .iter()
        .map(|n| vec![false; n.gpus.len()])
        .collect();
    let mut rows = Vec::new();
    for (job_index, job) in fleet.jobs.iter().enumerate() {
        let whole = filter.is_empty()
            || has(&job.job_key, filter)
            || job.slurm_job.as_deref().is_some_and(|s| has(s, filter))
            || job.nodes.iter().any(|n| has(n, filter));
        let mut gpu_rows = Vec::new();
        for (index, jg) in job.gpus.iter().enumerate() {
            match by_uuid.get(&(jg.node.as_str(), jg.uuid.as_str())) {
                Some(&(ni, gi)) => {
                    in_a_job[ni][gi] = true;
                    if whole || gpu_matches(&fleet.nodes[ni].gpus[gi], filter) {
                        gpu_rows.push((Some((ni, gi)), index));
                    }
                }
                None if whole => gpu_rows.push((None, index)),
                None => {}
            }
        }
        if !whole && gpu_rows.is_empty() {
            continue;
        }
        rows.push(Row::Job { job: job_index });
        if collapsed.contains(&job.job_key) {
            continue;
        }
        for (live, index) in gpu_rows {
            match live {
                Some((ni, gi)) => push_gpu(&mut rows, fleet, ni, gi, Some(job_index)),
                None => rows.push(Row::JobGpuOnly {
                    job: job_index,
                    index,
                }),
            }
        }
    }
    let mut loose = Vec::new();
    for (ni, node) in fleet.nodes.iter().enumerate() {
        for (gi, gpu) in node.gpus.iter().enumerate() {
            let shown = filter.is_empty() || has(&node.name, filter) || gpu_matches(gpu, filter);
            if !in_a_job[ni][gi] && shown {
                loose.push((ni, gi));
            }
        }
    }
    if !loose.is_empty() {
        rows.push(Row::NoJob { gpus: loose.len() });
        for (ni, gi) in loose {
            push_gpu(&mut rows, fleet, ni, gi, None);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn fixture() -> Fleet {
        // Read when the test runs, not built in: the container image builds without tests/.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/fleet/three-nodes.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn state() -> State {
        let mut s = State::new("http://p".into(), Duration::from_secs(5)).with_fleet(fixture(), 0);
        s.viewport = (120, 40);
        s
    }

    fn press(s: &mut State, keys: &[KeyCode]) -> Vec<Request> {
        keys.iter().filter_map(|&k| s.on_key(key(k))).collect()
    }

    fn type_text(s: &mut State, text: &str) {
        for c in text.chars() {
            s.on_key(key(KeyCode::Char(c)));
        }
    }

    #[test]
    fn nodes_come_worst_first_and_open_into_gpus() {
        let mut s = state();
        let names: Vec<&str> = s
            .rows()
            .iter()
            .filter_map(|r| match r {
                Row::Node { node } => Some(s.fleet.as_ref().unwrap().nodes[*node].name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["127.0.0.1", "dgx-synthetic", "gpu-node-11"]);
        assert_eq!(s.rows().len(), 3);
        press(&mut s, &[KeyCode::Down, KeyCode::Right]);
        // 8 GPUs and the straggler alert under GPU 5.
        assert_eq!(s.rows().len(), 3 + 8 + 1);
        assert!(matches!(s.rows()[8], Row::Alert { gpu: Some(5), .. }));
        // Left on a GPU line folds its node and selects the node again.
        press(&mut s, &[KeyCode::Down, KeyCode::Down, KeyCode::Left]);
        assert_eq!(s.rows().len(), 3);
        assert_eq!(s.selected, 1);
    }

    #[test]
    fn the_filter_narrows_to_matching_gpus_and_esc_clears_it() {
        let mut s = state();
        press(&mut s, &[KeyCode::Char('/')]);
        assert!(s.typing_filter);
        type_text(&mut s, "H200");
        // Typing does not trigger other keys: `q` inside the filter is text.
        assert!(!s.quit);
        assert_eq!(s.rows().len(), 3, "{:?}", s.rows());
        assert!(matches!(s.rows()[0], Row::Node { node: 2 }));
        press(&mut s, &[KeyCode::Enter]);
        assert!(!s.typing_filter);
        assert_eq!(s.filter, "H200");
        press(&mut s, &[KeyCode::Esc]);
        assert_eq!(s.filter, "");
        assert_eq!(s.rows().len(), 3);
        // Esc while typing clears too.
        press(&mut s, &[KeyCode::Char('/')]);
        type_text(&mut s, "straggler");
        let before = s.rows().len();
        assert!(before > 0);
        press(&mut s, &[KeyCode::Esc]);
        assert!(!s.typing_filter);
        assert_eq!(s.filter, "");
        // A filter that matches nothing leaves an empty table, not a panic on a move.
        press(&mut s, &[KeyCode::Char('/')]);
        type_text(&mut s, "nothing-like-this");
        press(&mut s, &[KeyCode::Enter, KeyCode::Down, KeyCode::Enter]);
        assert!(s.rows().is_empty());
        assert_eq!(s.view, View::Fleet);
    }

    #[test]
    fn grouping_by_job_lists_jobs_then_the_gpus_without_one() {
        let mut s = state();
        press(&mut s, &[KeyCode::Char('g')]);
        assert_eq!(s.grouping, Grouping::Job);
        assert!(matches!(s.rows()[0], Row::Job { job: 0 }));
        // synthetic-run: 8 GPUs + the alert; 9001: 2 GPUs; no GPU is left without a job.
        assert_eq!(s.rows().len(), 1 + 8 + 1 + 1 + 2);
        assert!(!s.rows().iter().any(|r| matches!(r, Row::NoJob { .. })));
        // Enter on the job row opens the job; Esc comes back.
        press(&mut s, &[KeyCode::Enter]);
        assert_eq!(s.view, View::Job("synthetic-run".into()));
        press(&mut s, &[KeyCode::Esc]);
        assert_eq!(s.view, View::Fleet);
        // Left folds the job to its line.
        press(&mut s, &[KeyCode::Left]);
        assert_eq!(s.rows().len(), 1 + 1 + 2);
    }

    #[test]
    fn enter_opens_a_node_and_asks_for_its_detail() {
        let mut s = state();
        let asked = press(&mut s, &[KeyCode::Down, KeyCode::Enter]);
        assert_eq!(s.view, View::Node("dgx-synthetic".into()));
        assert!(matches!(
            asked.as_slice(),
            [Request::Node { node, at_ms }] if node.name == "dgx-synthetic" && *at_ms == 1795689965196
        ));
        // A detail for another node (the user moved on) is dropped; its own is kept.
        let other = NodeDetail {
            node: "gpu-node-11".into(),
            ..NodeDetail::default()
        };
        s.on_report(Report::Node(Box::new(other)));
        assert!(s.detail.is_none());
        let own = NodeDetail {
            node: "dgx-synthetic".into(),
            ..NodeDetail::default()
        };
        s.on_report(Report::Node(Box::new(own)));
        assert!(s.detail.is_some());
        // Each new fleet asks for the open node again.
        assert!(matches!(
            s.on_report(Report::Fleet(Box::new(fixture()))),
            Some(Request::Node { .. })
        ));
        press(&mut s, &[KeyCode::Esc]);
        assert_eq!(s.view, View::Fleet);
        assert!(s.detail.is_none());
    }

    #[test]
    fn capital_j_opens_the_job_of_a_gpu() {
        let mut s = state();
        press(&mut s, &[KeyCode::Down, KeyCode::Right, KeyCode::Down]);
        assert!(matches!(s.rows()[s.selected], Row::Gpu { .. }));
        press(&mut s, &[KeyCode::Char('J')]);
        assert_eq!(s.view, View::Job("synthetic-run".into()));
        // The down node has no job: a note says so and the view stays.
        let mut s = state();
        press(&mut s, &[KeyCode::Char('J')]);
        assert_eq!(s.view, View::Fleet);
        assert!(s.notice.is_some());
    }

    #[test]
    fn a_failed_read_keeps_the_last_good_fleet_and_says_why() {
        let mut s = state();
        let mut failed = fixture();
        failed.nodes.clear();
        failed.could_not_run = Some("Prometheus at http://p: connection refused".into());
        s.on_report(Report::Fleet(Box::new(failed)));
        assert_eq!(s.fleet.as_ref().unwrap().nodes.len(), 3);
        assert_eq!(
            s.error.as_deref(),
            Some("Prometheus at http://p: connection refused")
        );
        s.on_report(Report::Fleet(Box::new(fixture())));
        assert!(s.error.is_none());
    }

    #[test]
    fn the_selection_stays_on_its_node_across_reads() {
        let mut s = state();
        press(&mut s, &[KeyCode::Down, KeyCode::Down]);
        let mut reordered = fixture();
        reordered.nodes.reverse();
        s.on_report(Report::Fleet(Box::new(reordered)));
        let Row::Node { node } = s.rows()[s.selected] else {
            panic!("not a node row")
        };
        assert_eq!(s.fleet.as_ref().unwrap().nodes[node].name, "gpu-node-11");
    }

    #[test]
    fn paging_keeps_the_selection_on_screen() {
        let mut s = state();
        s.viewport = (120, 8);
        press(&mut s, &[KeyCode::Char('E')]);
        assert_eq!(s.page(), 3);
        press(&mut s, &[KeyCode::End]);
        assert_eq!(s.selected, s.rows().len() - 1);
        assert!(s.offset + s.page() > s.selected && s.offset <= s.selected);
        press(&mut s, &[KeyCode::Home]);
        assert_eq!((s.selected, s.offset), (0, 0));
    }

    #[test]
    fn alerts_view_lists_each_alert_and_opens_its_node() {
        let mut s = state();
        press(&mut s, &[KeyCode::Char('a')]);
        assert_eq!(s.view, View::Alerts);
        let list = s.alert_list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].alert.name, "GpuJobStraggler");
        assert_eq!(list[0].gpu.and_then(|g| g.gpu.as_deref()), Some("5"));
        let asked = press(&mut s, &[KeyCode::Enter]);
        assert_eq!(asked.len(), 1);
        assert_eq!(s.view, View::Node("dgx-synthetic".into()));
        press(&mut s, &[KeyCode::Esc]);
        assert_eq!(s.view, View::Alerts);
        press(&mut s, &[KeyCode::Esc]);
        assert_eq!(s.view, View::Fleet);
    }

    #[test]
    fn quit_help_and_ctrl_c() {
        let mut s = state();
        press(&mut s, &[KeyCode::Char('?')]);
        assert!(s.show_help);
        // Any key closes the help and does nothing else.
        press(&mut s, &[KeyCode::Char('q')]);
        assert!(!s.show_help && !s.quit);
        press(&mut s, &[KeyCode::Char('q')]);
        assert!(s.quit);
        let mut s = state();
        press(&mut s, &[KeyCode::Char('/')]);
        s.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(s.quit, "Ctrl-C quits even while typing a filter");
    }
}
