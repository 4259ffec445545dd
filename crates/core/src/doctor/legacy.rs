//! The snapshot reader as it was before issue 32 (a generic value tree read through a
//! `BufReader` one opcode field at a time, a hashed memo, every frame's strings copied and
//! hashed at every reference), kept for two uses only: the baseline `vramlab bench-snapshot`
//! times side by side with [`super::read_snapshot`], and the oracle of the differential
//! tests (both readers must type every snapshot identically). Nothing else calls it.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use super::error::DoctorError;
use super::pickle::{Limits, Node, NodeId, Pickle, PickleError};
use super::snapshot::Frame;
use super::snapshot::{Action, BlockState, SegmentState, Snapshot, TraceEntry};

/// Small-pool segments are this large (`kSmallBuffer`).
const SMALL_BUFFER: u64 = 2 << 20;

/// Reads a snapshot the way vramlab did before issue 32.
pub fn read_snapshot_legacy<R: Read>(
    reader: R,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<Snapshot, DoctorError> {
    let p = read_pickle(reader, Limits::default(), progress)?;
    from_pickle(&p)
}

/// Counts bytes read and reports them every `step` bytes.
struct Counting<'a, R> {
    inner: R,
    read: u64,
    next_report: u64,
    step: u64,
    progress: &'a mut dyn FnMut(u64) -> bool,
    cancelled: bool,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read >= self.next_report {
            self.next_report = self.read + self.step;
            if !(self.progress)(self.read) {
                self.cancelled = true;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "cancelled",
                ));
            }
        }
        Ok(n)
    }
}

/// Stack entry: a value or a MARK.
#[derive(Clone, Copy)]
enum Slot {
    Mark,
    Val(NodeId),
}

struct Unpickler<'a, R: Read> {
    src: std::io::BufReader<Counting<'a, R>>,
    offset: u64,
    nodes: Vec<Node>,
    stack: Vec<Slot>,
    memo: std::collections::HashMap<u32, NodeId>,
    strings: std::collections::HashSet<Arc<str>>,
    limits: Limits,
}

/// Strings up to this many bytes are shared.
const SHORT_STRING: usize = 96;

/// Reads a pickle from `reader`, calling `progress(bytes_read)` about every MiB; when
/// `progress` returns false the read stops with [`PickleError::Cancelled`].
fn read_pickle<R: Read>(
    reader: R,
    limits: Limits,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<Pickle, PickleError> {
    let counting = Counting {
        inner: reader,
        read: 0,
        next_report: 0,
        step: 1 << 20,
        progress,
        cancelled: false,
    };
    let mut u = Unpickler {
        src: std::io::BufReader::with_capacity(1 << 16, counting),
        offset: 0,
        nodes: Vec::new(),
        stack: Vec::new(),
        memo: std::collections::HashMap::new(),
        strings: std::collections::HashSet::new(),
        limits,
    };
    let result = u.run();
    if u.src.get_ref().cancelled {
        return Err(PickleError::Cancelled);
    }
    let root = result?;
    Ok(Pickle {
        nodes: u.nodes,
        root,
    })
}

fn refused(code: u8) -> Option<&'static str> {
    Some(match code {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

impl<R: Read> Unpickler<'_, R> {
    fn malformed(&self, what: impl Into<String>) -> PickleError {
        PickleError::Malformed {
            offset: self.offset,
            what: what.into(),
        }
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), PickleError> {
        match self.src.read_exact(buf) {
            Ok(()) => {
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(PickleError::Truncated {
                    offset: self.offset,
                    what,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, PickleError> {
        let mut b = [0u8; 1];
        self.read_exact(&mut b, what)?;
        Ok(b[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, PickleError> {
        let mut b = [0u8; 2];
        self.read_exact(&mut b, what)?;
        Ok(u16::from_le_bytes(b))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, PickleError> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, PickleError> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Reads `len` bytes without trusting `len` for the allocation: the buffer grows
    /// only as bytes really arrive.
    fn bytes(&mut self, len: u64, what: &'static str) -> Result<Vec<u8>, PickleError> {
        if len > self.limits.max_string_bytes as u64 {
            return Err(PickleError::Limit(format!(
                "a {what} of {len} bytes (the limit is {})",
                self.limits.max_string_bytes
            )));
        }
        let mut out = Vec::with_capacity(len.min(1 << 16) as usize);
        let got = (&mut self.src).take(len).read_to_end(&mut out)?;
        self.offset += got as u64;
        if (got as u64) < len {
            return Err(PickleError::Truncated {
                offset: self.offset,
                what,
            });
        }
        Ok(out)
    }

    fn string(&mut self, len: u64) -> Result<Arc<str>, PickleError> {
        // Short strings (dict keys, file and function names) repeat: read them without a
        // heap buffer and share one copy.
        if len <= SHORT_STRING as u64 {
            let mut buf = [0u8; SHORT_STRING];
            let b = &mut buf[..len as usize];
            self.read_exact(b, "string")?;
            let text = std::str::from_utf8(b)
                .map_err(|_| self.malformed("a string is not valid UTF-8"))?;
            if let Some(shared) = self.strings.get(text) {
                return Ok(shared.clone());
            }
            let shared: Arc<str> = Arc::from(text);
            self.strings.insert(shared.clone());
            return Ok(shared);
        }
        let b = self.bytes(len, "string")?;
        String::from_utf8(b)
            .map(Arc::from)
            .map_err(|_| self.malformed("a string is not valid UTF-8"))
    }

    /// A line ending in `\n` (text opcodes), bounded like a string.
    fn line(&mut self) -> Result<String, PickleError> {
        let mut out = Vec::new();
        loop {
            let b = self.u8("a text line")?;
            if b == b'\n' {
                break;
            }
            if out.len() >= 4096 {
                return Err(self.malformed("a text line longer than 4096 bytes"));
            }
            out.push(b);
        }
        String::from_utf8(out).map_err(|_| self.malformed("a text line is not UTF-8"))
    }

    fn push_node(&mut self, n: Node) -> Result<NodeId, PickleError> {
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(PickleError::Limit(format!(
                "more than {} values",
                self.limits.max_nodes
            )));
        }
        let id = NodeId(
            u32::try_from(self.nodes.len())
                .map_err(|_| PickleError::Limit("more than 2^32 values".into()))?,
        );
        self.nodes.push(n);
        Ok(id)
    }

    fn push(&mut self, n: Node) -> Result<(), PickleError> {
        let id = self.push_node(n)?;
        self.push_slot(Slot::Val(id))
    }

    fn push_slot(&mut self, s: Slot) -> Result<(), PickleError> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(PickleError::Limit(format!(
                "a stack deeper than {} items",
                self.limits.max_stack
            )));
        }
        self.stack.push(s);
        Ok(())
    }

    fn pop(&mut self) -> Result<NodeId, PickleError> {
        match self.stack.pop() {
            Some(Slot::Val(id)) => Ok(id),
            Some(Slot::Mark) => Err(self.malformed("a value was expected, found a MARK")),
            None => Err(self.malformed("pop from an empty stack")),
        }
    }

    fn top(&self) -> Result<NodeId, PickleError> {
        match self.stack.last() {
            Some(Slot::Val(id)) => Ok(*id),
            _ => Err(self.malformed("a value was expected on the stack")),
        }
    }

    /// Pops everything down to the last MARK.
    fn pop_mark(&mut self) -> Result<Vec<NodeId>, PickleError> {
        let pos = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| self.malformed("no MARK on the stack"))?;
        let items = self
            .stack
            .drain(pos + 1..)
            .filter_map(|s| match s {
                Slot::Val(id) => Some(id),
                Slot::Mark => None,
            })
            .collect();
        self.stack.truncate(pos);
        Ok(items)
    }

    fn memo_put(&mut self, key: u32) -> Result<(), PickleError> {
        let id = self.top()?;
        if self.memo.len() >= self.limits.max_memo && !self.memo.contains_key(&key) {
            return Err(PickleError::Limit(format!(
                "more than {} memo entries",
                self.limits.max_memo
            )));
        }
        self.memo.insert(key, id);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), PickleError> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.malformed(format!("memo key {key} was never stored")))?;
        self.push_slot(Slot::Val(id))
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        // Every id on the stack was made by push_node.
        &mut self.nodes[id.0 as usize]
    }

    fn append(&mut self, list: NodeId, items: Vec<NodeId>) -> Result<(), PickleError> {
        match self.node_mut(list) {
            Node::List(v) | Node::Set(v) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(self.malformed("APPEND/ADDITEMS to something that is not a list or set")),
        }
    }

    fn set_items(&mut self, dict: NodeId, flat: Vec<NodeId>) -> Result<(), PickleError> {
        if !flat.len().is_multiple_of(2) {
            return Err(self.malformed("SETITEMS with an odd number of items"));
        }
        match self.node_mut(dict) {
            Node::Dict(v) => {
                v.extend(flat.chunks_exact(2).map(|c| (c[0], c[1])));
                Ok(())
            }
            _ => Err(self.malformed("SETITEM(S) on something that is not a dict")),
        }
    }

    fn long(&mut self, bytes: &[u8]) -> Result<i128, PickleError> {
        if bytes.is_empty() {
            return Ok(0);
        }
        if bytes.len() > 16 {
            return Err(PickleError::Limit(format!(
                "an integer of {} bytes (at most 16 are read)",
                bytes.len()
            )));
        }
        let negative = bytes[bytes.len() - 1] & 0x80 != 0;
        let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(i128::from_le_bytes(buf))
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one arm per pickle opcode: the dispatch reads best in one place"
    )]
    fn run(&mut self) -> Result<NodeId, PickleError> {
        loop {
            let at = self.offset;
            let code = self.u8("an opcode")?;
            if let Some(name) = refused(code) {
                return Err(PickleError::Refused {
                    name,
                    code,
                    offset: at,
                });
            }
            match code {
                0x80 => {
                    let p = self.u8("PROTO")?;
                    if !(2..=5).contains(&p) {
                        return Err(PickleError::Protocol(p));
                    }
                }
                0x95 => {
                    // FRAME: a length hint only; the bytes follow as ordinary opcodes.
                    self.u64("FRAME")?;
                }
                b'.' => return self.pop(),
                b'(' => self.push_slot(Slot::Mark)?,
                b'0' => {
                    self.stack
                        .pop()
                        .ok_or_else(|| self.malformed("POP from an empty stack"))?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let id = self.top()?;
                    self.push_slot(Slot::Val(id))?;
                }
                b'N' => self.push(Node::None)?,
                0x88 => self.push(Node::Bool(true))?,
                0x89 => self.push(Node::Bool(false))?,
                b'J' => {
                    let v = self.u32("BININT")? as i32;
                    self.push(Node::Int(i128::from(v)))?;
                }
                b'K' => {
                    let v = self.u8("BININT1")?;
                    self.push(Node::Int(i128::from(v)))?;
                }
                b'M' => {
                    let v = self.u16("BININT2")?;
                    self.push(Node::Int(i128::from(v)))?;
                }
                0x8a => {
                    let n = self.u8("LONG1")?;
                    let b = self.bytes(u64::from(n), "LONG1")?;
                    let v = self.long(&b)?;
                    self.push(Node::Int(v))?;
                }
                0x8b => {
                    let n = self.u32("LONG4")?;
                    let b = self.bytes(u64::from(n), "LONG4")?;
                    let v = self.long(&b)?;
                    self.push(Node::Int(v))?;
                }
                b'I' => {
                    let line = self.line()?;
                    let node = match line.trim() {
                        "00" => Node::Bool(false),
                        "01" => Node::Bool(true),
                        t => Node::Int(
                            t.parse::<i128>()
                                .map_err(|_| self.malformed(format!("INT `{t}`")))?,
                        ),
                    };
                    self.push(node)?;
                }
                b'L' => {
                    let line = self.line()?;
                    let t = line.trim().trim_end_matches('L');
                    let v = t
                        .parse::<i128>()
                        .map_err(|_| self.malformed(format!("LONG `{t}`")))?;
                    self.push(Node::Int(v))?;
                }
                b'G' => {
                    let v = self.u64("BINFLOAT")?;
                    self.push(Node::Float(f64::from_bits(v.swap_bytes())))?;
                }
                b'F' => {
                    let line = self.line()?;
                    let v = line
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| self.malformed("FLOAT"))?;
                    self.push(Node::Float(v))?;
                }
                0x8c => {
                    let n = self.u8("SHORT_BINUNICODE")?;
                    let s = self.string(u64::from(n))?;
                    self.push(Node::Str(s))?;
                }
                b'X' => {
                    let n = self.u32("BINUNICODE")?;
                    let s = self.string(u64::from(n))?;
                    self.push(Node::Str(s))?;
                }
                0x8d => {
                    let n = self.u64("BINUNICODE8")?;
                    let s = self.string(n)?;
                    self.push(Node::Str(s))?;
                }
                b'U' => {
                    let n = self.u8("SHORT_BINSTRING")?;
                    let b = self.bytes(u64::from(n), "SHORT_BINSTRING")?;
                    self.push(Node::Bytes(b))?;
                }
                b'T' => {
                    let n = self.u32("BINSTRING")?;
                    let b = self.bytes(u64::from(n), "BINSTRING")?;
                    self.push(Node::Bytes(b))?;
                }
                b'C' => {
                    let n = self.u8("SHORT_BINBYTES")?;
                    let b = self.bytes(u64::from(n), "SHORT_BINBYTES")?;
                    self.push(Node::Bytes(b))?;
                }
                b'B' => {
                    let n = self.u32("BINBYTES")?;
                    let b = self.bytes(u64::from(n), "BINBYTES")?;
                    self.push(Node::Bytes(b))?;
                }
                0x8e => {
                    let n = self.u64("BINBYTES8")?;
                    let b = self.bytes(n, "BINBYTES8")?;
                    self.push(Node::Bytes(b))?;
                }
                0x96 => {
                    let n = self.u64("BYTEARRAY8")?;
                    let b = self.bytes(n, "BYTEARRAY8")?;
                    self.push(Node::Bytes(b))?;
                }
                b'}' => self.push(Node::Dict(Vec::new()))?,
                b']' => self.push(Node::List(Vec::new()))?,
                b')' => self.push(Node::Tuple(Vec::new()))?,
                0x8f => self.push(Node::Set(Vec::new()))?,
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Tuple(items))?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Node::Set(items))?;
                }
                0x85..=0x87 => {
                    let n = usize::from(code - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Node::Tuple(items))?;
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Node::List(items))?;
                }
                b'd' => {
                    let flat = self.pop_mark()?;
                    if !flat.len().is_multiple_of(2) {
                        return Err(self.malformed("DICT with an odd number of items"));
                    }
                    let pairs = flat.chunks_exact(2).map(|c| (c[0], c[1])).collect();
                    self.push(Node::Dict(pairs))?;
                }
                b'a' => {
                    let v = self.pop()?;
                    let list = self.top()?;
                    self.append(list, vec![v])?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    self.append(list, items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let dict = self.top()?;
                    self.set_items(dict, vec![k, v])?;
                }
                b'u' => {
                    let flat = self.pop_mark()?;
                    let dict = self.top()?;
                    self.set_items(dict, flat)?;
                }
                b'p' => {
                    let line = self.line()?;
                    let k = line
                        .trim()
                        .parse::<u32>()
                        .map_err(|_| self.malformed("PUT key"))?;
                    self.memo_put(k)?;
                }
                b'q' => {
                    let k = self.u8("BINPUT")?;
                    self.memo_put(u32::from(k))?;
                }
                b'r' => {
                    let k = self.u32("LONG_BINPUT")?;
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k = u32::try_from(self.memo.len())
                        .map_err(|_| PickleError::Limit("memo too large".into()))?;
                    self.memo_put(k)?;
                }
                b'g' => {
                    let line = self.line()?;
                    let k = line
                        .trim()
                        .parse::<u32>()
                        .map_err(|_| self.malformed("GET key"))?;
                    self.memo_get(k)?;
                }
                b'h' => {
                    let k = self.u8("BINGET")?;
                    self.memo_get(u32::from(k))?;
                }
                b'j' => {
                    let k = self.u32("LONG_BINGET")?;
                    self.memo_get(k)?;
                }
                _ => return Err(PickleError::UnknownOpcode { code, offset: at }),
            }
        }
    }
}

struct Interner {
    frames: Vec<Frame>,
    frame_ids: HashMap<(Arc<str>, i64, Arc<str>), u32>,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
    by_node: HashMap<NodeId, u32>,
}

impl Interner {
    fn stack(&mut self, p: &Pickle, frames: Option<NodeId>) -> u32 {
        let Some(list) = frames else { return 0 };
        if let Some(id) = self.by_node.get(&list) {
            return *id;
        }
        let mut ids = Vec::new();
        for f in p.items(list) {
            let s = |k| {
                p.field(*f, k)
                    .and_then(|v| p.as_str(v))
                    .map(Arc::<str>::from)
                    .unwrap_or_else(|| Arc::from(""))
            };
            let filename = s("filename");
            let name = s("name");
            let line = p
                .field(*f, "line")
                .and_then(|v| p.as_int(v))
                .and_then(|v| i64::try_from(v).ok())
                .unwrap_or(0);
            let key = (filename.clone(), line, name.clone());
            let next = self.frames.len() as u32;
            let id = *self.frame_ids.entry(key).or_insert_with(|| next);
            if id == next {
                self.frames.push(Frame {
                    filename: filename.to_string(),
                    line,
                    name: name.to_string(),
                });
            }
            ids.push(id);
        }
        let next = self.stacks.len() as u32;
        let id = *self.stack_ids.entry(ids.clone()).or_insert_with(|| next);
        if id == next {
            self.stacks.push(ids);
        }
        self.by_node.insert(list, id);
        id
    }
}

fn int(p: &Pickle, d: NodeId, k: &str) -> Option<i128> {
    p.field(d, k).and_then(|v| p.as_int(v))
}

fn uint(p: &Pickle, d: NodeId, k: &str) -> u64 {
    int(p, d, k)
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(0)
}

/// `Snapshot::from_pickle` before issue 32.
fn from_pickle(p: &Pickle) -> Result<Snapshot, DoctorError> {
    let root = p.root;
    let not_snapshot = |what: &str| DoctorError::NotSnapshot(what.to_string());
    if !matches!(p.get(root), Node::Dict(_)) {
        return Err(not_snapshot("the top-level value is not a dict"));
    }
    let segs = p.field(root, "segments");
    let traces = p.field(root, "device_traces");
    if segs.is_none() && traces.is_none() {
        return Err(not_snapshot(
            "it has neither `segments` nor `device_traces` (is it a torch.cuda.memory._dump_snapshot file?)",
        ));
    }
    let mut it = Interner {
        frames: Vec::new(),
        frame_ids: HashMap::new(),
        stacks: vec![Vec::new()],
        stack_ids: HashMap::from([(Vec::new(), 0)]),
        by_node: HashMap::new(),
    };
    let mut segments = Vec::new();
    for s in segs.map(|s| p.items(s)).unwrap_or(&[]) {
        let mut blocks = Vec::new();
        for b in p.field(*s, "blocks").map(|b| p.items(b)).unwrap_or(&[]) {
            let state = p.field(*b, "state").and_then(|v| p.as_str(v)).unwrap_or("");
            blocks.push(BlockState {
                address: uint(p, *b, "address"),
                size: uint(p, *b, "size"),
                requested_size: uint(p, *b, "requested_size"),
                allocated: state.starts_with("active"),
                stack: it.stack(p, p.field(*b, "frames")),
            });
        }
        let total_size = uint(p, *s, "total_size");
        segments.push(SegmentState {
            device: int(p, *s, "device")
                .and_then(|v| i64::try_from(v).ok())
                .unwrap_or(0),
            address: uint(p, *s, "address"),
            total_size,
            allocated_size: uint(p, *s, "allocated_size"),
            is_small: p
                .field(*s, "segment_type")
                .and_then(|v| p.as_str(v))
                .map_or(total_size == SMALL_BUFFER, |t| t == "small"),
            is_expandable: p
                .field(*s, "is_expandable")
                .and_then(|v| p.as_bool(v))
                .unwrap_or(false),
            blocks,
        });
    }
    let mut all = Vec::new();
    for dev in traces.map(|t| p.items(t)).unwrap_or(&[]) {
        let mut out = Vec::with_capacity(p.items(*dev).len());
        for e in p.items(*dev) {
            let action = p
                .field(*e, "action")
                .and_then(|v| p.as_str(v))
                .map_or(Action::Other, Action::parse);
            out.push(TraceEntry {
                action,
                addr: uint(p, *e, "addr"),
                size: uint(p, *e, "size"),
                stream: int(p, *e, "stream")
                    .and_then(|v| i64::try_from(v).ok())
                    .unwrap_or(0),
                time_us: int(p, *e, "time_us")
                    .and_then(|v| i64::try_from(v).ok())
                    .unwrap_or(0),
                device_free: int(p, *e, "device_free").and_then(|v| u64::try_from(v).ok()),
                stack: it.stack(p, p.field(*e, "frames")),
            });
        }
        all.push(out);
    }
    let allocator_settings = p
        .field(root, "allocator_settings")
        .map_or(serde_json::Value::Null, |s| p.to_json(s, 4));
    Ok(Snapshot {
        segments,
        traces: all,
        stacks: it.stacks,
        frames: it.frames,
        allocator_settings,
    })
}
