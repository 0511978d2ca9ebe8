//! The collector's wire format, decoded into [`CollectorMessage`]s.
//!
//! Version 1, as collector/collector.c writes it (its top comment says the same). One
//! `SOCK_SEQPACKET` datagram per message, at most [`MAX_MESSAGE`] bytes, little-endian. Every
//! message starts with a 16-byte header: u32 magic [`MAGIC`] ("GPDK"), u16 version, u16 type,
//! u32 pid (the sender's own view; gpudiag uses the pid `SO_PEERCRED` gives), u32 count.
//!
//! | type | body |
//! |---|---|
//! | 1 hello | u32 parent pid, u32 CUPTI API version (0: none), u32 collector version, u32 0, clock, u16 length + libcupti source |
//! | 2 device | u32 CUDA ordinal, u32 1 when the UUID is known, 16 UUID bytes |
//! | 3 kernels | clock, u32 names, u32 bytes of names, names (u32 id, u16 length, bytes), `count` × 72-byte records |
//! | 4 copies | clock, `count` × 48-byte records |
//! | 5 sets | clock, `count` × 40-byte records |
//! | 6 syncs | clock, `count` × 40-byte records |
//! | 7 losses | u64 CUPTI dropped, u64 not sent, u64 names cut |
//! | 8 stepped aside | u64 from, u64 to, u32 1 when `to` is known, u32 0 |
//! | 9 cannot record | u16 length + why |
//! | 10 goodbye | nothing |
//! | 11 window | u64 from (Unix ns), u64 to (Unix ns), u32 flags (1: `to` is known; 2: sampling gave way, recorded in full from `from`), u32 0 |
//!
//! A clock is u64 CUPTI ns then u64 Unix ns, read together at send time. Kernel names are
//! interned per process: each id is defined once, in the kernels message that first uses it
//! (id 0: the collector's table was full). The record layouts are in the `decode_*` functions.
//!
//! Everything here assumes hostile input: every length is checked against the message before
//! anything is allocated, names are bounded per connection and across all of them, and a
//! message that breaks a rule is refused whole ([`Malformed`]), never half-read.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpudiag_model::kernels::{
    ClockPair, CollectorHello, CollectorLosses, CollectorMessage, CopyDirection, CopyRecord,
    CudaDevice, HostMemory, KernelRecord, MAX_KERNEL_NAME_BYTES, SetRecord, SyncCall, SyncRecord,
};

pub const MAGIC: u32 = 0x4B44_5047;
pub const VERSION: u16 = 1;
pub const MAX_MESSAGE: usize = 65536;
pub const HEADER_BYTES: usize = 16;

pub const TYPE_HELLO: u16 = 1;
pub const TYPE_DEVICE: u16 = 2;
pub const TYPE_KERNELS: u16 = 3;
pub const TYPE_COPIES: u16 = 4;
pub const TYPE_SETS: u16 = 5;
pub const TYPE_SYNCS: u16 = 6;
pub const TYPE_LOSSES: u16 = 7;
pub const TYPE_STEPPED_ASIDE: u16 = 8;
pub const TYPE_CANNOT_RECORD: u16 = 9;
pub const TYPE_GOODBYE: u16 = 10;
pub const TYPE_WINDOW: u16 = 11;

pub const KERNEL_BYTES: usize = 72;
pub const COPY_BYTES: usize = 48;
pub const SET_BYTES: usize = 40;
pub const SYNC_BYTES: usize = 40;

/// The name a kernel gets when the collector's name table was full (name id 0).
pub const NAME_TABLE_FULL: &str = "(name not kept: the collector's name table was full)";

/// Names one connection may define; a real collector stops at 12,288.
const MAX_NAMES_PER_CONNECTION: usize = 16_384;
/// Contexts whose device one connection remembers (syncs name a context, not a device).
const MAX_CONTEXTS_PER_CONNECTION: usize = 4_096;

/// CUPTI's "does not apply" in synchronisation records.
const SYNC_INVALID: u32 = u32::MAX;

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn malformed<T>(why: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(why.into()))
}

/// Bytes of kernel names held by every connection together; shared by a listener's
/// connections so many senders cannot add up to unbounded memory.
#[derive(Debug)]
pub struct NameBudget {
    used: AtomicUsize,
    limit: usize,
}

impl NameBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(NameBudget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

/// What one connection (one process's collector) has told so far: its kernel names and which
/// device each context is on.
#[derive(Debug)]
pub struct Decoder {
    pid: u32,
    names: HashMap<u32, Arc<str>>,
    name_bytes: usize,
    budget: Arc<NameBudget>,
    context_device: HashMap<u32, u32>,
    table_full: Arc<str>,
}

impl Drop for Decoder {
    fn drop(&mut self) {
        self.budget.give_back(self.name_bytes);
    }
}

/// A little-endian reader over one message that refuses to read past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return malformed(format!(
                "message ends at byte {} where {} more were due",
                self.bytes.len(),
                n
            ));
        };
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn clock(&mut self) -> Result<ClockPair, Malformed> {
        Ok(ClockPair {
            cupti_ns: self.u64()?,
            unix_ns: self.u64()?,
        })
    }

    fn text(&mut self, limit: usize) -> Result<String, Malformed> {
        let len = self.u16()? as usize;
        if len > limit {
            return malformed(format!("a text of {len} bytes, over the {limit} allowed"));
        }
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn end(&self) -> Result<(), Malformed> {
        match self.remaining() {
            0 => Ok(()),
            n => malformed(format!("{n} bytes left over after the message")),
        }
    }

    /// Splits the rest into exactly `count` records of `size` bytes.
    fn records(&mut self, count: u32, size: usize) -> Result<Vec<&'a [u8]>, Malformed> {
        let expected = (count as usize).checked_mul(size);
        if expected != Some(self.remaining()) {
            return malformed(format!(
                "{count} records of {size} bytes do not fill the {} bytes left",
                self.remaining()
            ));
        }
        Ok(self.take(self.remaining())?.chunks_exact(size).collect())
    }
}

/// Little-endian fields at fixed offsets of a record whose length was checked.
fn u16_at(r: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([r[at], r[at + 1]])
}
fn u32_at(r: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([r[at], r[at + 1], r[at + 2], r[at + 3]])
}
fn u64_at(r: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&r[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A UUID as NVML spells it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn nvml_uuid(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| -> String {
        bytes[r].iter().map(|b| format!("{b:02x}")).collect()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// CUPTI's copy kind (`CUpti_ActivityMemcpyKind`).
pub fn copy_direction(kind: u8) -> CopyDirection {
    match kind {
        1 => CopyDirection::HostToDevice,
        2 => CopyDirection::DeviceToHost,
        8 => CopyDirection::DeviceToDevice,
        9 => CopyDirection::HostToHost,
        10 => CopyDirection::PeerToPeer,
        _ => CopyDirection::Other,
    }
}

/// The host side of a copy from CUPTI's memory kinds (`CUpti_ActivityMemoryKind`) of its source
/// and destination.
pub fn host_memory(direction: CopyDirection, src: u8, dst: u8) -> HostMemory {
    const PAGEABLE: u8 = 1;
    const PINNED: u8 = 2;
    const MANAGED: u8 = 5;
    let host_kind = |k: u8| match k {
        PAGEABLE => Some(HostMemory::Pageable),
        PINNED => Some(HostMemory::Pinned),
        MANAGED => Some(HostMemory::Managed),
        _ => None,
    };
    match direction {
        CopyDirection::DeviceToDevice | CopyDirection::PeerToPeer => HostMemory::NoHostSide,
        CopyDirection::HostToDevice => host_kind(src).unwrap_or(HostMemory::Unknown),
        CopyDirection::DeviceToHost => host_kind(dst).unwrap_or(HostMemory::Unknown),
        // Either side may be the host's; a pageable one is what stages the copy.
        _ => match (host_kind(src), host_kind(dst)) {
            (Some(HostMemory::Pageable), _) | (_, Some(HostMemory::Pageable)) => {
                HostMemory::Pageable
            }
            (Some(k), _) | (None, Some(k)) => k,
            (None, None) => HostMemory::Unknown,
        },
    }
}

/// CUPTI's synchronisation type (`CUpti_ActivitySynchronizationType`).
pub fn sync_call(kind: u32) -> SyncCall {
    match kind {
        1 => SyncCall::EventSynchronize,
        2 => SyncCall::StreamWaitEvent,
        3 => SyncCall::StreamSynchronize,
        4 => SyncCall::ContextSynchronize,
        _ => SyncCall::Unknown,
    }
}

impl Decoder {
    /// A decoder for the connection of process `pid` (from `SO_PEERCRED`, which every message
    /// is attributed to whatever pid it claims).
    pub fn new(pid: u32, budget: Arc<NameBudget>) -> Self {
        Decoder {
            pid,
            names: HashMap::new(),
            name_bytes: 0,
            budget,
            context_device: HashMap::new(),
            table_full: Arc::from(NAME_TABLE_FULL),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Decodes one message. `Ok(None)` for a message that only defines names.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<Option<CollectorMessage>, Malformed> {
        if bytes.len() > MAX_MESSAGE {
            return malformed(format!("a message of {} bytes", bytes.len()));
        }
        let mut r = Reader { bytes, at: 0 };
        let magic = r.u32()?;
        if magic != MAGIC {
            return malformed(format!("magic {magic:#010x}, not a gpudiag collector's"));
        }
        let version = r.u16()?;
        if version != VERSION {
            return malformed(format!(
                "wire version {version}; this gpudiag reads {VERSION}"
            ));
        }
        let kind = r.u16()?;
        let _claimed_pid = r.u32()?;
        let count = r.u32()?;
        let pid = self.pid;
        let message = match kind {
            TYPE_HELLO => {
                let parent_pid = r.u32()?;
                let cupti_api_version = r.u32()?;
                let collector_version = r.u32()?;
                let _ = r.u32()?;
                let clock = r.clock()?;
                let cupti_source = r.text(256)?;
                CollectorMessage::Hello(CollectorHello {
                    pid,
                    parent_pid,
                    cupti_api_version,
                    cupti_source,
                    collector_version,
                    devices: Vec::new(),
                    clock,
                })
            }
            TYPE_DEVICE => {
                let ordinal = r.u32()?;
                let known = r.u32()?;
                let uuid = r.array::<16>()?;
                CollectorMessage::Device {
                    pid,
                    device: CudaDevice {
                        ordinal,
                        uuid: (known == 1).then(|| nvml_uuid(&uuid)),
                    },
                }
            }
            TYPE_KERNELS => {
                let clock = r.clock()?;
                let name_count = r.u32()?;
                let name_bytes = r.u32()? as usize;
                let mut names = Reader {
                    bytes: r.take(name_bytes)?,
                    at: 0,
                };
                let records = r.records(count, KERNEL_BYTES)?;
                // Read whole before any is kept, so a refused message defines nothing.
                let mut defined = Vec::new();
                for _ in 0..name_count {
                    let id = names.u32()?;
                    let len = names.u16()? as usize;
                    if id == 0 || len > MAX_KERNEL_NAME_BYTES {
                        return malformed(format!("kernel name {id} of {len} bytes"));
                    }
                    defined.push((id, names.take(len)?));
                }
                names.end()?;
                for (id, text) in defined {
                    self.define_name(id, text);
                }
                let mut out = Vec::with_capacity(records.len());
                for k in records {
                    out.push(self.kernel(k)?);
                }
                if out.is_empty() {
                    return Ok(None);
                }
                CollectorMessage::Kernels {
                    pid,
                    clock,
                    records: out,
                }
            }
            TYPE_COPIES => {
                let clock = r.clock()?;
                let records = r
                    .records(count, COPY_BYTES)?
                    .into_iter()
                    .map(|c| self.copy(c))
                    .collect();
                CollectorMessage::Copies {
                    pid,
                    clock,
                    records,
                }
            }
            TYPE_SETS => {
                let clock = r.clock()?;
                let records = r
                    .records(count, SET_BYTES)?
                    .into_iter()
                    .map(|s| self.set(s))
                    .collect();
                CollectorMessage::Sets {
                    pid,
                    clock,
                    records,
                }
            }
            TYPE_SYNCS => {
                let clock = r.clock()?;
                let records = r
                    .records(count, SYNC_BYTES)?
                    .into_iter()
                    .map(|s| self.sync(s))
                    .collect();
                CollectorMessage::Syncs {
                    pid,
                    clock,
                    records,
                }
            }
            TYPE_LOSSES => CollectorMessage::Losses {
                pid,
                losses: CollectorLosses {
                    cupti_dropped: r.u64()?,
                    send_dropped: r.u64()?,
                    names_cut: r.u64()?,
                },
            },
            TYPE_STEPPED_ASIDE => {
                let from_ns = r.u64()?;
                let to = r.u64()?;
                let known = r.u32()?;
                let _ = r.u32()?;
                CollectorMessage::SteppedAside {
                    pid,
                    from_ns,
                    to_ns: (known == 1).then_some(to),
                }
            }
            TYPE_CANNOT_RECORD => CollectorMessage::CannotRecord {
                pid,
                why: r.text(4000)?,
            },
            TYPE_GOODBYE => CollectorMessage::Goodbye { pid },
            TYPE_WINDOW => {
                let from_unix_ns = r.u64()?;
                let to = r.u64()?;
                let flags = r.u32()?;
                let _ = r.u32()?;
                if flags & !3 != 0 {
                    return malformed(format!("window flags {flags:#x}"));
                }
                let to_unix_ns = (flags & 1 == 1).then_some(to);
                if to_unix_ns.is_some_and(|to| to < from_unix_ns) {
                    return malformed(format!(
                        "a window that ends ({to}) before it starts ({from_unix_ns})"
                    ));
                }
                CollectorMessage::Window {
                    pid,
                    from_unix_ns,
                    to_unix_ns,
                    gave_way: flags & 2 == 2,
                }
            }
            other => return malformed(format!("message type {other}")),
        };
        r.end()?;
        Ok(Some(message))
    }

    fn define_name(&mut self, id: u32, text: &[u8]) {
        if self.names.contains_key(&id)
            || self.names.len() >= MAX_NAMES_PER_CONNECTION
            || !self.budget.take(text.len())
        {
            return;
        }
        self.name_bytes += text.len();
        self.names
            .insert(id, Arc::from(String::from_utf8_lossy(text).as_ref()));
    }

    fn note_device(&mut self, context: u32, device: u32) {
        if self.context_device.len() < MAX_CONTEXTS_PER_CONNECTION
            || self.context_device.contains_key(&context)
        {
            self.context_device.insert(context, device);
        }
    }

    fn kernel(&mut self, k: &[u8]) -> Result<KernelRecord, Malformed> {
        let name_id = u32_at(k, 28);
        let name = match name_id {
            0 => self.table_full.clone(),
            id => match self.names.get(&id) {
                Some(name) => name.clone(),
                None => return malformed(format!("kernel name id {id} was never defined")),
            },
        };
        let (device, context) = (u32_at(k, 16), u32_at(k, 20));
        self.note_device(context, device);
        let graph = u32_at(k, 64);
        Ok(KernelRecord {
            start_ns: u64_at(k, 0),
            end_ns: u64_at(k, 8),
            device,
            context,
            stream: u32_at(k, 24),
            name,
            grid: [u32_at(k, 32), u32_at(k, 36), u32_at(k, 40)],
            block: [u32_at(k, 44), u32_at(k, 48), u32_at(k, 52)],
            registers_per_thread: u16_at(k, 56),
            shared_memory_bytes: u32_at(k, 60),
            graph_id: (graph != 0).then_some(graph),
            correlation_id: u32_at(k, 68),
        })
    }

    fn copy(&mut self, c: &[u8]) -> CopyRecord {
        let (device, context) = (u32_at(c, 16), u32_at(c, 20));
        self.note_device(context, device);
        let direction = copy_direction(c[40]);
        let graph = u32_at(c, 44);
        CopyRecord {
            start_ns: u64_at(c, 0),
            end_ns: u64_at(c, 8),
            device,
            context,
            stream: u32_at(c, 24),
            bytes: u64_at(c, 32),
            direction,
            host_memory: host_memory(direction, c[41], c[42]),
            graph_id: (graph != 0).then_some(graph),
            correlation_id: u32_at(c, 28),
        }
    }

    fn set(&mut self, s: &[u8]) -> SetRecord {
        let (device, context) = (u32_at(s, 16), u32_at(s, 20));
        self.note_device(context, device);
        SetRecord {
            start_ns: u64_at(s, 0),
            end_ns: u64_at(s, 8),
            device,
            context,
            stream: u32_at(s, 24),
            bytes: u64_at(s, 32),
            correlation_id: u32_at(s, 28),
        }
    }

    fn sync(&mut self, s: &[u8]) -> SyncRecord {
        let context = u32_at(s, 16);
        let stream = u32_at(s, 20);
        let call = sync_call(u32_at(s, 28));
        SyncRecord {
            start_ns: u64_at(s, 0),
            end_ns: u64_at(s, 8),
            device: self.context_device.get(&context).copied(),
            context,
            stream: (stream != SYNC_INVALID && call != SyncCall::ContextSynchronize)
                .then_some(stream),
            call,
            correlation_id: u32_at(s, 24),
        }
    }
}

/// Builds messages as the collector does, for tests and fixtures: every function here writes
/// the bytes collector.c's structs would.
pub mod encode {
    use super::*;

    pub fn header(kind: u16, pid: u32, count: u32) -> Vec<u8> {
        let mut m = Vec::with_capacity(64);
        m.extend_from_slice(&MAGIC.to_le_bytes());
        m.extend_from_slice(&VERSION.to_le_bytes());
        m.extend_from_slice(&kind.to_le_bytes());
        m.extend_from_slice(&pid.to_le_bytes());
        m.extend_from_slice(&count.to_le_bytes());
        m
    }

    fn clock(m: &mut Vec<u8>, c: ClockPair) {
        m.extend_from_slice(&c.cupti_ns.to_le_bytes());
        m.extend_from_slice(&c.unix_ns.to_le_bytes());
    }

    fn text(m: &mut Vec<u8>, t: &str) {
        m.extend_from_slice(&(t.len() as u16).to_le_bytes());
        m.extend_from_slice(t.as_bytes());
    }

    pub fn hello(pid: u32, parent: u32, api: u32, source: &str, c: ClockPair) -> Vec<u8> {
        let mut m = header(TYPE_HELLO, pid, 0);
        for v in [parent, api, 1, 0] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        clock(&mut m, c);
        text(&mut m, source);
        m
    }

    pub fn device(pid: u32, ordinal: u32, uuid: Option<[u8; 16]>) -> Vec<u8> {
        let mut m = header(TYPE_DEVICE, pid, 0);
        m.extend_from_slice(&ordinal.to_le_bytes());
        m.extend_from_slice(&u32::from(uuid.is_some()).to_le_bytes());
        m.extend_from_slice(&uuid.unwrap_or_default());
        m
    }

    /// A kernel record as the wire has it, with its name id.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Kernel {
        pub start: u64,
        pub end: u64,
        pub device: u32,
        pub context: u32,
        pub stream: u32,
        pub name: u32,
        pub grid: [u32; 3],
        pub block: [u32; 3],
        pub registers: u16,
        pub shared: u32,
        pub graph: u32,
        pub correlation: u32,
    }

    pub fn kernels(pid: u32, c: ClockPair, names: &[(u32, &[u8])], records: &[Kernel]) -> Vec<u8> {
        let mut m = header(TYPE_KERNELS, pid, records.len() as u32);
        clock(&mut m, c);
        let mut defs = Vec::new();
        for (id, text) in names {
            defs.extend_from_slice(&id.to_le_bytes());
            defs.extend_from_slice(&(text.len() as u16).to_le_bytes());
            defs.extend_from_slice(text);
        }
        m.extend_from_slice(&(names.len() as u32).to_le_bytes());
        m.extend_from_slice(&(defs.len() as u32).to_le_bytes());
        m.extend_from_slice(&defs);
        for k in records {
            for v in [k.start, k.end] {
                m.extend_from_slice(&v.to_le_bytes());
            }
            for v in [k.device, k.context, k.stream, k.name] {
                m.extend_from_slice(&v.to_le_bytes());
            }
            for v in k.grid.iter().chain(&k.block) {
                m.extend_from_slice(&v.to_le_bytes());
            }
            m.extend_from_slice(&k.registers.to_le_bytes());
            m.extend_from_slice(&0u16.to_le_bytes());
            for v in [k.shared, k.graph, k.correlation] {
                m.extend_from_slice(&v.to_le_bytes());
            }
        }
        m
    }

    /// A copy record: (start, end, device, context, stream, correlation, bytes, copy kind,
    /// source kind, destination kind, graph id).
    #[allow(clippy::type_complexity)]
    pub fn copies(
        pid: u32,
        c: ClockPair,
        records: &[(u64, u64, u32, u32, u32, u32, u64, u8, u8, u8, u32)],
    ) -> Vec<u8> {
        let mut m = header(TYPE_COPIES, pid, records.len() as u32);
        clock(&mut m, c);
        for &(start, end, device, context, stream, corr, bytes, kind, src, dst, graph) in records {
            m.extend_from_slice(&start.to_le_bytes());
            m.extend_from_slice(&end.to_le_bytes());
            for v in [device, context, stream, corr] {
                m.extend_from_slice(&v.to_le_bytes());
            }
            m.extend_from_slice(&bytes.to_le_bytes());
            m.extend_from_slice(&[kind, src, dst, 0]);
            m.extend_from_slice(&graph.to_le_bytes());
        }
        m
    }

    /// A set record: (start, end, device, context, stream, correlation, bytes).
    pub fn sets(
        pid: u32,
        c: ClockPair,
        records: &[(u64, u64, u32, u32, u32, u32, u64)],
    ) -> Vec<u8> {
        let mut m = header(TYPE_SETS, pid, records.len() as u32);
        clock(&mut m, c);
        for &(start, end, device, context, stream, corr, bytes) in records {
            m.extend_from_slice(&start.to_le_bytes());
            m.extend_from_slice(&end.to_le_bytes());
            for v in [device, context, stream, corr] {
                m.extend_from_slice(&v.to_le_bytes());
            }
            m.extend_from_slice(&bytes.to_le_bytes());
        }
        m
    }

    /// A sync record: (start, end, context, stream, correlation, CUPTI type, event).
    pub fn syncs(
        pid: u32,
        c: ClockPair,
        records: &[(u64, u64, u32, u32, u32, u32, u32)],
    ) -> Vec<u8> {
        let mut m = header(TYPE_SYNCS, pid, records.len() as u32);
        clock(&mut m, c);
        for &(start, end, context, stream, corr, kind, event) in records {
            m.extend_from_slice(&start.to_le_bytes());
            m.extend_from_slice(&end.to_le_bytes());
            for v in [context, stream, corr, kind, event, 0] {
                m.extend_from_slice(&v.to_le_bytes());
            }
        }
        m
    }

    pub fn losses(pid: u32, l: CollectorLosses) -> Vec<u8> {
        let mut m = header(TYPE_LOSSES, pid, 0);
        for v in [l.cupti_dropped, l.send_dropped, l.names_cut] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m
    }

    pub fn stepped_aside(pid: u32, from: u64, to: Option<u64>) -> Vec<u8> {
        let mut m = header(TYPE_STEPPED_ASIDE, pid, 0);
        m.extend_from_slice(&from.to_le_bytes());
        m.extend_from_slice(&to.unwrap_or(0).to_le_bytes());
        m.extend_from_slice(&u32::from(to.is_some()).to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m
    }

    pub fn window(pid: u32, from: u64, to: Option<u64>, gave_way: bool) -> Vec<u8> {
        let mut m = header(TYPE_WINDOW, pid, 0);
        m.extend_from_slice(&from.to_le_bytes());
        m.extend_from_slice(&to.unwrap_or(0).to_le_bytes());
        let flags = u32::from(to.is_some()) | (u32::from(gave_way) << 1);
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m
    }

    pub fn cannot_record(pid: u32, why: &str) -> Vec<u8> {
        let mut m = header(TYPE_CANNOT_RECORD, pid, 0);
        text(&mut m, why);
        m
    }

    pub fn goodbye(pid: u32) -> Vec<u8> {
        header(TYPE_GOODBYE, pid, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::encode::Kernel;
    use super::*;

    const CLOCK: ClockPair = ClockPair {
        cupti_ns: 5000,
        unix_ns: 1_700_000_000_000_000_000,
    };

    fn decoder() -> Decoder {
        Decoder::new(42, NameBudget::new(1 << 20))
    }

    /// A kernels message written out byte by byte as collector.c's structs lay it out, so the
    /// decoder is held to the C side and not only to `encode`.
    #[test]
    fn golden_bytes_of_a_kernels_message_decode_to_their_fields() {
        let mut bytes: Vec<u8> = vec![
            0x47, 0x50, 0x44, 0x4b, // magic "GPDK"
            0x01, 0x00, 0x03, 0x00, // version 1, type 3 (kernels)
            0x39, 0x05, 0x00, 0x00, // pid 1337 (ignored: SO_PEERCRED's is used)
            0x01, 0x00, 0x00, 0x00, // one record
            0x88, 0x13, 0, 0, 0, 0, 0, 0, // CUPTI ns 5000
            0x00, 0x00, 0x10, 0x63, 0x2d, 0x5e, 0xc7, 0x6b, // Unix ns
            0x01, 0x00, 0x00, 0x00, // one name
            0x0a, 0x00, 0x00, 0x00, // of 10 bytes in all
            0x05, 0x00, 0x00, 0x00, 0x04, 0x00, b'g', b'e', b'm', b'm', // id 5, "gemm"
        ];
        // The record: start 100, end 250, device 1, context 2, stream 7, name 5, grid 64×2×1,
        // block 128×1×1, 32 registers, 4096 bytes of shared memory, graph 9, correlation 11.
        for v in [100u64, 250] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        for v in [1u32, 2, 7, 5, 64, 2, 1, 128, 1, 1] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes.extend_from_slice(&[32, 0, 0, 0]);
        for v in [4096u32, 9, 11] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(bytes.len(), 16 + 16 + 8 + 10 + KERNEL_BYTES);
        let Some(CollectorMessage::Kernels {
            pid,
            clock,
            records,
        }) = decoder().decode(&bytes).unwrap()
        else {
            panic!("not a kernels message");
        };
        assert_eq!(pid, 42);
        assert_eq!(clock.cupti_ns, 5000);
        assert_eq!(clock.unix_ns, 0x6bc7_5e2d_6310_0000);
        assert_eq!(
            records,
            vec![KernelRecord {
                start_ns: 100,
                end_ns: 250,
                device: 1,
                context: 2,
                stream: 7,
                name: Arc::from("gemm"),
                grid: [64, 2, 1],
                block: [128, 1, 1],
                registers_per_thread: 32,
                shared_memory_bytes: 4096,
                graph_id: Some(9),
                correlation_id: 11,
            }]
        );
    }

    fn every_kind_of_message() -> Vec<Vec<u8>> {
        let k = Kernel {
            start: 1,
            end: 2,
            name: 1,
            ..Kernel::default()
        };
        vec![
            encode::hello(1, 2, 130001, "already loaded", CLOCK),
            encode::device(1, 0, Some([0xab; 16])),
            encode::kernels(1, CLOCK, &[(1, b"k".as_slice())], &[k, k]),
            encode::copies(1, CLOCK, &[(1, 2, 0, 3, 7, 9, 4096, 1, 1, 3, 0)]),
            encode::sets(1, CLOCK, &[(1, 2, 0, 3, 7, 9, 512)]),
            encode::syncs(1, CLOCK, &[(1, 2, 3, 7, 9, 3, u32::MAX)]),
            encode::losses(1, CollectorLosses::default()),
            encode::stepped_aside(1, 10, Some(20)),
            encode::cannot_record(1, "no libcupti"),
            encode::goodbye(1),
            encode::window(1, 100, Some(300), false),
            encode::window(1, 300, None, true),
        ]
    }

    #[test]
    fn every_kind_of_message_decodes() {
        let mut d = decoder();
        let decoded: Vec<CollectorMessage> = every_kind_of_message()
            .iter()
            .map(|m| d.decode(m).unwrap().unwrap())
            .collect();
        assert!(matches!(&decoded[0], CollectorMessage::Hello(h)
            if h.cupti_api_version == 130001 && h.cupti_source == "already loaded" && h.parent_pid == 2));
        assert_eq!(
            decoded[1],
            CollectorMessage::Device {
                pid: 42,
                device: CudaDevice {
                    ordinal: 0,
                    uuid: Some("GPU-abababab-abab-abab-abab-abababababab".into())
                }
            }
        );
        let CollectorMessage::Copies { records, .. } = &decoded[3] else {
            panic!()
        };
        assert_eq!(records[0].direction, CopyDirection::HostToDevice);
        assert_eq!(records[0].host_memory, HostMemory::Pageable);
        assert_eq!(records[0].graph_id, None);
        let CollectorMessage::Syncs { records, .. } = &decoded[5] else {
            panic!()
        };
        // The context's device, learned from the copy and set on it.
        assert_eq!(records[0].device, Some(0));
        assert_eq!(records[0].stream, Some(7));
        assert_eq!(records[0].call, SyncCall::StreamSynchronize);
        assert_eq!(
            decoded[7],
            CollectorMessage::SteppedAside {
                pid: 42,
                from_ns: 10,
                to_ns: Some(20)
            }
        );
        assert_eq!(decoded[9], CollectorMessage::Goodbye { pid: 42 });
        assert_eq!(
            decoded[10],
            CollectorMessage::Window {
                pid: 42,
                from_unix_ns: 100,
                to_unix_ns: Some(300),
                gave_way: false
            }
        );
        assert_eq!(
            decoded[11],
            CollectorMessage::Window {
                pid: 42,
                from_unix_ns: 300,
                to_unix_ns: None,
                gave_way: true
            }
        );
    }

    #[test]
    fn a_message_cut_anywhere_is_refused_never_half_read() {
        for message in every_kind_of_message() {
            for len in 0..message.len() {
                assert!(
                    decoder().decode(&message[..len]).is_err(),
                    "{len} of {} bytes accepted",
                    message.len()
                );
            }
            // A byte too many is refused as well.
            let mut longer = message.clone();
            longer.push(0);
            assert!(decoder().decode(&longer).is_err());
        }
    }

    #[test]
    fn wrong_magic_version_or_type_is_refused() {
        let good = encode::goodbye(1);
        let mut m = good.clone();
        m[0] ^= 0xff;
        assert!(decoder().decode(&m).unwrap_err().0.contains("magic"));
        let mut m = good.clone();
        m[4] = 2;
        assert!(decoder().decode(&m).unwrap_err().0.contains("version"));
        let mut m = good;
        m[6] = 99;
        assert!(decoder().decode(&m).unwrap_err().0.contains("type"));
        assert!(decoder().decode(&vec![0; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn an_absurd_count_is_refused_before_anything_is_allocated() {
        for kind in [TYPE_KERNELS, TYPE_COPIES, TYPE_SETS, TYPE_SYNCS] {
            let mut m = encode::header(kind, 1, u32::MAX);
            m.extend_from_slice(&[0; 16 + 8]);
            assert!(decoder().decode(&m).is_err());
        }
        // A names count far beyond the names given.
        let mut m = encode::kernels(1, CLOCK, &[], &[]);
        m[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decoder().decode(&m).is_err());
    }

    #[test]
    fn names_are_bounded_checked_and_must_be_defined() {
        let k = Kernel {
            name: 3,
            ..Kernel::default()
        };
        // Used before any definition.
        let err = decoder()
            .decode(&encode::kernels(1, CLOCK, &[], &[k]))
            .unwrap_err();
        assert!(err.0.contains("never defined"), "{err}");
        // A name longer than the collector ever sends.
        let long = vec![b'x'; MAX_KERNEL_NAME_BYTES + 1];
        assert!(
            decoder()
                .decode(&encode::kernels(1, CLOCK, &[(3, &long)], &[k]))
                .is_err()
        );
        // Id 0 is reserved for "the table was full".
        assert!(
            decoder()
                .decode(&encode::kernels(1, CLOCK, &[(0, b"a")], &[]))
                .is_err()
        );
        let full = Kernel {
            name: 0,
            ..Kernel::default()
        };
        let Some(CollectorMessage::Kernels { records, .. }) = decoder()
            .decode(&encode::kernels(1, CLOCK, &[], &[full]))
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(&*records[0].name, NAME_TABLE_FULL);
        // Bytes that are not UTF-8 are kept, replaced.
        let Some(CollectorMessage::Kernels { records, .. }) = decoder()
            .decode(&encode::kernels(1, CLOCK, &[(3, b"a\xffb")], &[k]))
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(&*records[0].name, "a\u{fffd}b");
        // A refused message defines nothing: its names are read whole before any is kept.
        let mut d = decoder();
        let mut m = encode::kernels(1, CLOCK, &[(3, b"gemm")], &[k]);
        m.push(0);
        assert!(d.decode(&m).is_err());
        assert!(d.decode(&encode::kernels(1, CLOCK, &[], &[k])).is_err());
    }

    #[test]
    fn names_across_connections_stay_within_the_budget() {
        let budget = NameBudget::new(10_000);
        let name = vec![b'n'; 1000];
        let mut decoders: Vec<Decoder> = (0..20)
            .map(|pid| Decoder::new(pid, budget.clone()))
            .collect();
        let mut kept = 0;
        for (i, d) in decoders.iter_mut().enumerate() {
            let k = Kernel {
                name: 1,
                ..Kernel::default()
            };
            if d.decode(&encode::kernels(i as u32, CLOCK, &[(1, &name)], &[k]))
                .is_ok()
            {
                kept += 1;
            }
        }
        assert_eq!(kept, 10);
        assert_eq!(budget.used.load(Ordering::Relaxed), 10_000);
        // A connection that ends gives its names' bytes back.
        decoders.truncate(5);
        assert_eq!(budget.used.load(Ordering::Relaxed), 5_000);
        // One connection cannot define more than its share of names, however small.
        let mut d = decoder();
        let many: Vec<(u32, &[u8])> = (1..=2000u32).map(|id| (id, b"k".as_slice())).collect();
        for chunk in 0..10 {
            let defs: Vec<(u32, &[u8])> =
                many.iter().map(|&(id, t)| (id + chunk * 2000, t)).collect();
            let _ = d.decode(&encode::kernels(1, CLOCK, &defs, &[]));
        }
        assert_eq!(d.names.len(), MAX_NAMES_PER_CONNECTION);
    }

    #[test]
    fn random_bytes_never_panic() {
        // xorshift: the same bytes every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut d = decoder();
        for i in 0..20_000 {
            let len = (next() % 300) as usize;
            let mut m: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Half of them with a valid header, so the bodies get read.
            if i % 2 == 0 && m.len() >= 16 {
                m[..4].copy_from_slice(&MAGIC.to_le_bytes());
                m[4..6].copy_from_slice(&VERSION.to_le_bytes());
                m[6..8].copy_from_slice(&((next() % 12) as u16).to_le_bytes());
                m[12..16].copy_from_slice(&((next() % 4) as u32).to_le_bytes());
            }
            let _ = d.decode(&m);
        }
    }

    #[test]
    fn copies_say_which_side_was_the_host_and_how_it_was_held() {
        use CopyDirection::*;
        assert_eq!(host_memory(HostToDevice, 1, 3), HostMemory::Pageable);
        assert_eq!(host_memory(HostToDevice, 2, 3), HostMemory::Pinned);
        assert_eq!(host_memory(DeviceToHost, 3, 1), HostMemory::Pageable);
        assert_eq!(host_memory(DeviceToHost, 3, 5), HostMemory::Managed);
        assert_eq!(host_memory(DeviceToDevice, 3, 3), HostMemory::NoHostSide);
        assert_eq!(host_memory(PeerToPeer, 3, 3), HostMemory::NoHostSide);
        assert_eq!(host_memory(HostToHost, 2, 1), HostMemory::Pageable);
        assert_eq!(host_memory(Other, 4, 2), HostMemory::Pinned);
        assert_eq!(host_memory(HostToDevice, 0, 3), HostMemory::Unknown);
        assert_eq!(copy_direction(3), Other);
        assert_eq!(copy_direction(200), Other);
        assert_eq!(sync_call(4), SyncCall::ContextSynchronize);
        assert_eq!(sync_call(0), SyncCall::Unknown);
    }

    #[test]
    fn a_context_synchronisation_names_no_stream() {
        let m = encode::syncs(1, CLOCK, &[(1, 2, 3, 0, 9, 4, u32::MAX)]);
        let Some(CollectorMessage::Syncs { records, .. }) = decoder().decode(&m).unwrap() else {
            panic!()
        };
        assert_eq!(records[0].stream, None);
        // No kernel, copy or set told which device context 3 is on.
        assert_eq!(records[0].device, None);
    }

    #[test]
    fn the_uuid_is_spelled_as_nvml_spells_it() {
        let bytes: [u8; 16] = core::array::from_fn(|i| i as u8);
        assert_eq!(
            nvml_uuid(&bytes),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
    }
}
