//! A safe reader for the data subset of Python's pickle format (protocols 2–5).
//!
//! `torch.cuda.memory._dump_snapshot` writes its snapshot with `pickle.dump` of plain
//! dicts, lists, tuples, ints, floats, strings and bools. This reader understands exactly
//! those opcodes and refuses every opcode that would name or call Python code (`GLOBAL`,
//! `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, persistent ids, extension
//! codes): nothing is ever executed. Values live in an arena ([`Pickle`]); the stream is
//! read incrementally, length fields are checked against what is actually read and
//! against [`Limits`], so a hostile file costs at most the limits, never a panic.

use std::io::Read;
use std::sync::Arc;

use thiserror::Error;

/// Index of a value in [`Pickle::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(pub u32);

/// One unpickled value. Containers hold ids of their children, so values shared through
/// the pickle memo are shared here too (and a container that contains itself is a cycle
/// in ids, not an infinite structure).
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    None,
    Bool(bool),
    /// Any integer that fits 128 bits (PyTorch's addresses and sizes fit 64).
    Int(i128),
    Float(f64),
    Str(Arc<str>),
    Bytes(Vec<u8>),
    List(Vec<NodeId>),
    Tuple(Vec<NodeId>),
    /// Key/value pairs in file order.
    Dict(Vec<(NodeId, NodeId)>),
    Set(Vec<NodeId>),
}

/// What is wrong with a pickle stream.
#[derive(Debug, Error)]
pub enum PickleError {
    #[error("reading the pickle: {0}")]
    Io(#[from] std::io::Error),
    #[error("the pickle ends early (at byte {offset}, inside {what})")]
    Truncated { offset: u64, what: &'static str },
    #[error(
        "refused opcode {name} (0x{code:02x}) at byte {offset}: it would import or call \
         Python code; a memory snapshot holds only plain data"
    )]
    Refused {
        name: &'static str,
        code: u8,
        offset: u64,
    },
    #[error("unknown pickle opcode 0x{code:02x} at byte {offset}")]
    UnknownOpcode { code: u8, offset: u64 },
    #[error("unsupported pickle protocol {0} (this reader knows protocols 2 to 5)")]
    Protocol(u8),
    #[error("malformed pickle at byte {offset}: {what}")]
    Malformed { offset: u64, what: String },
    #[error("the pickle exceeds a limit: {0}")]
    Limit(String),
    #[error("cancelled")]
    Cancelled,
}

/// Bounds on what one pickle may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most values in the arena.
    pub max_nodes: usize,
    /// Most bytes in one string or bytes value.
    pub max_string_bytes: usize,
    /// Most items on the unpickler's stack (deep nesting grows it).
    pub max_stack: usize,
    /// Most memo entries.
    pub max_memo: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_nodes: 200_000_000,
            max_string_bytes: 64 << 20,
            max_stack: 10_000_000,
            max_memo: 100_000_000,
        }
    }
}

/// A decoded pickle: the arena and the top-level value.
#[derive(Debug, Clone)]
pub struct Pickle {
    pub nodes: Vec<Node>,
    pub root: NodeId,
}

impl Pickle {
    /// The value with this id.
    pub fn get(&self, id: NodeId) -> &Node {
        // Ids come from this arena only; an out-of-range id reads as None.
        self.nodes.get(id.0 as usize).unwrap_or(&Node::None)
    }

    /// The value under `key` of a dict with string keys.
    pub fn field(&self, dict: NodeId, key: &str) -> Option<NodeId> {
        match self.get(dict) {
            Node::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(self.get(*k), Node::Str(s) if &**s == key))
                .map(|(_, v)| *v),
            _ => None,
        }
    }

    /// Items of a list or tuple (empty for anything else).
    pub fn items(&self, id: NodeId) -> &[NodeId] {
        match self.get(id) {
            Node::List(v) | Node::Tuple(v) | Node::Set(v) => v,
            _ => &[],
        }
    }

    pub fn as_int(&self, id: NodeId) -> Option<i128> {
        match self.get(id) {
            Node::Int(i) => Some(*i),
            Node::Bool(b) => Some(i128::from(*b)),
            _ => None,
        }
    }

    pub fn as_str(&self, id: NodeId) -> Option<&str> {
        match self.get(id) {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self, id: NodeId) -> Option<bool> {
        match self.get(id) {
            Node::Bool(b) => Some(*b),
            Node::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    pub fn as_f64(&self, id: NodeId) -> Option<f64> {
        match self.get(id) {
            Node::Float(f) => Some(*f),
            Node::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// A JSON rendering of a value, depth-limited (deeper levels and cycles become null).
    pub fn to_json(&self, id: NodeId, depth: usize) -> serde_json::Value {
        use serde_json::Value as J;
        if depth == 0 {
            return J::Null;
        }
        match self.get(id) {
            Node::None => J::Null,
            Node::Bool(b) => J::Bool(*b),
            Node::Int(i) => i64::try_from(*i)
                .map(J::from)
                .unwrap_or_else(|_| J::String(i.to_string())),
            Node::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Node::Str(s) => J::String(s.to_string()),
            Node::Bytes(b) => J::String(format!("<{} bytes>", b.len())),
            Node::List(v) | Node::Tuple(v) | Node::Set(v) => {
                J::Array(v.iter().map(|c| self.to_json(*c, depth - 1)).collect())
            }
            Node::Dict(items) => {
                let mut m = serde_json::Map::new();
                for (k, v) in items {
                    let key = match self.get(*k) {
                        Node::Str(s) => s.to_string(),
                        _ => self.to_json(*k, 1).to_string(),
                    };
                    m.insert(key, self.to_json(*v, depth - 1));
                }
                J::Object(m)
            }
        }
    }
}

/// Bytes held in the read buffer at most.
const BUFFER: usize = 1 << 18;
/// Progress is reported about this often (bytes read).
const REPORT_STEP: u64 = 1 << 20;
/// Strings up to this many bytes are shared.
const SHORT_STRING: usize = 96;
/// A memo key this far past the dense part goes to the sparse map (a hostile `LONG_BINPUT
/// 4000000000` costs one map entry, not a 4-billion-slot table).
const MEMO_GAP: usize = 1 << 16;
/// A memo slot never written.
const NO_NODE: NodeId = NodeId(u32::MAX);

/// The stream behind a bounded buffer: opcodes and their fields are parsed from the buffer
/// in place; only strings and bytes longer than the buffer are gathered into their own
/// allocation, and then only as their bytes arrive.
struct Source<'a, R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    eof: bool,
    next_report: u64,
    progress: &'a mut dyn FnMut(u64) -> bool,
}

impl<R: Read> Source<'_, R> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes `n` (at most [`BUFFER`]) bytes available; false at the end of the stream.
    fn fill(&mut self, n: usize) -> Result<bool, PickleError> {
        debug_assert!(n <= BUFFER, "fill({n}) beyond the buffer");
        self.buf.copy_within(self.pos..self.end, 0);
        self.base += self.pos as u64;
        self.end -= self.pos;
        self.pos = 0;
        while self.end < n && !self.eof {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
            let read = self.base + self.end as u64;
            if read >= self.next_report {
                self.next_report = read + REPORT_STEP;
                if !(self.progress)(read) {
                    return Err(PickleError::Cancelled);
                }
            }
        }
        Ok(self.end - self.pos >= n)
    }

    /// The next `n` (at most [`BUFFER`]) bytes.
    #[inline]
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], PickleError> {
        if self.end - self.pos < n && !self.fill(n)? {
            return Err(PickleError::Truncated {
                offset: self.base + self.end as u64,
                what,
            });
        }
        let at = self.pos;
        self.pos += n;
        Ok(&self.buf[at..at + n])
    }

    #[inline]
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], PickleError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// `len` bytes of any length (the caller checked it against the limits): copied out as
    /// they arrive, so a length field larger than the stream costs only what is there.
    fn gather(&mut self, len: u64, what: &'static str) -> Result<Vec<u8>, PickleError> {
        let mut out = Vec::with_capacity(len.min(BUFFER as u64) as usize);
        let mut left = len;
        while left > 0 {
            if self.pos == self.end && !self.fill(1)? {
                return Err(PickleError::Truncated {
                    offset: self.offset(),
                    what,
                });
            }
            let n = (self.end - self.pos).min(usize::try_from(left).unwrap_or(usize::MAX));
            out.extend_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            left -= n as u64;
        }
        Ok(out)
    }
}

/// Stack entry: a value or a MARK.
#[derive(Clone, Copy)]
enum Slot {
    Mark,
    Val(NodeId),
}

struct Unpickler<'a, R: Read> {
    src: Source<'a, R>,
    nodes: Vec<Node>,
    stack: Vec<Slot>,
    /// Positions of the MARKs on the stack, innermost last.
    marks: Vec<usize>,
    /// Memo keys 0.. as written by `MEMOIZE` and `BINPUT`: a table, not a hash.
    memo: Vec<NodeId>,
    /// Keys far beyond the table (never written by Python's pickler).
    memo_sparse: std::collections::HashMap<u32, NodeId>,
    memo_count: usize,
    strings: std::collections::HashSet<Arc<str>>,
    limits: Limits,
}

/// Reads a pickle from `reader`, calling `progress(bytes_read)` about every MiB; when
/// `progress` returns false the read stops with [`PickleError::Cancelled`].
pub fn read_pickle<R: Read>(
    reader: R,
    limits: Limits,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<Pickle, PickleError> {
    let mut u = Unpickler {
        src: Source {
            inner: reader,
            buf: vec![0; BUFFER],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            next_report: 0,
            progress,
        },
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        memo_sparse: std::collections::HashMap::new(),
        memo_count: 0,
        strings: std::collections::HashSet::new(),
        limits,
    };
    let root = u.run()?;
    Ok(Pickle {
        nodes: u.nodes,
        root,
    })
}

/// Reads a pickle held in memory.
pub fn read_pickle_bytes(bytes: &[u8], limits: Limits) -> Result<Pickle, PickleError> {
    read_pickle(bytes, limits, &mut |_| true)
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

/// Shares `text` through `strings` (one allocation per distinct short string).
fn share(strings: &mut std::collections::HashSet<Arc<str>>, text: &str) -> Arc<str> {
    if let Some(shared) = strings.get(text) {
        return shared.clone();
    }
    let shared: Arc<str> = Arc::from(text);
    strings.insert(shared.clone());
    shared
}

fn long(bytes: &[u8]) -> Result<i128, PickleError> {
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

impl<R: Read> Unpickler<'_, R> {
    fn malformed(&self, what: impl Into<String>) -> PickleError {
        PickleError::Malformed {
            offset: self.src.offset(),
            what: what.into(),
        }
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, PickleError> {
        Ok(self.src.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, PickleError> {
        Ok(u16::from_le_bytes(self.src.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.src.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.src.array(what)?))
    }

    fn check_len(&self, len: u64, what: &'static str) -> Result<(), PickleError> {
        if len > self.limits.max_string_bytes as u64 {
            return Err(PickleError::Limit(format!(
                "a {what} of {len} bytes (the limit is {})",
                self.limits.max_string_bytes
            )));
        }
        Ok(())
    }

    /// Bytes of a length field's size, bounded by the limits and by what arrives.
    fn bytes(&mut self, len: u64, what: &'static str) -> Result<Vec<u8>, PickleError> {
        self.check_len(len, what)?;
        self.src.gather(len, what)
    }

    fn string(&mut self, len: u64) -> Result<Arc<str>, PickleError> {
        self.check_len(len, "string")?;
        // Short strings (dict keys, action names, "N/A") repeat: parsed in the buffer and
        // shared; a hit costs no allocation.
        if len <= SHORT_STRING as u64 {
            let offset = self.src.offset();
            let b = self.src.take(len as usize, "string")?;
            let Ok(text) = std::str::from_utf8(b) else {
                return Err(PickleError::Malformed {
                    offset,
                    what: "a string is not valid UTF-8".into(),
                });
            };
            return Ok(share(&mut self.strings, text));
        }
        let b = self.src.gather(len, "string")?;
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

    #[inline]
    fn push_node(&mut self, n: Node) -> Result<NodeId, PickleError> {
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(PickleError::Limit(format!(
                "more than {} values",
                self.limits.max_nodes
            )));
        }
        let id = NodeId(
            u32::try_from(self.nodes.len())
                .ok()
                .filter(|i| *i != NO_NODE.0)
                .ok_or_else(|| PickleError::Limit("more than 2^32 values".into()))?,
        );
        self.nodes.push(n);
        Ok(id)
    }

    #[inline]
    fn push(&mut self, n: Node) -> Result<(), PickleError> {
        let id = self.push_node(n)?;
        self.push_slot(Slot::Val(id))
    }

    #[inline]
    fn push_slot(&mut self, s: Slot) -> Result<(), PickleError> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(PickleError::Limit(format!(
                "a stack deeper than {} items",
                self.limits.max_stack
            )));
        }
        if matches!(s, Slot::Mark) {
            self.marks.push(self.stack.len());
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

    /// Pops any one stack item (`POP`), a MARK included.
    fn pop_any(&mut self) -> Result<(), PickleError> {
        match self.stack.pop() {
            Some(Slot::Mark) => {
                self.marks.pop();
                Ok(())
            }
            Some(Slot::Val(_)) => Ok(()),
            None => Err(self.malformed("POP from an empty stack")),
        }
    }

    fn top(&self) -> Result<NodeId, PickleError> {
        match self.stack.last() {
            Some(Slot::Val(id)) => Ok(*id),
            _ => Err(self.malformed("a value was expected on the stack")),
        }
    }

    /// The stack position of the innermost MARK (its items follow it).
    fn mark(&self) -> Result<usize, PickleError> {
        self.marks
            .last()
            .copied()
            .ok_or_else(|| self.malformed("no MARK on the stack"))
    }

    /// Pops everything down to the innermost MARK into a new vector.
    fn pop_mark(&mut self) -> Result<Vec<NodeId>, PickleError> {
        let pos = self.mark()?;
        let items = self.stack[pos + 1..]
            .iter()
            .filter_map(|s| match s {
                Slot::Val(id) => Some(*id),
                Slot::Mark => None,
            })
            .collect();
        self.stack.truncate(pos);
        self.marks.pop();
        Ok(items)
    }

    fn memo_put(&mut self, key: u32) -> Result<(), PickleError> {
        let id = self.top()?;
        let k = key as usize;
        let fresh = match self.memo.get(k) {
            Some(old) => *old == NO_NODE,
            None => !self.memo_sparse.contains_key(&key),
        };
        if fresh && self.memo_count >= self.limits.max_memo {
            return Err(PickleError::Limit(format!(
                "more than {} memo entries",
                self.limits.max_memo
            )));
        }
        if k < self.memo.len() {
            self.memo[k] = id;
        } else if k <= self.memo.len() + MEMO_GAP {
            let from = self.memo.len();
            self.memo.resize(k + 1, NO_NODE);
            // Keys the table now covers leave the sparse map: each key lives in one place.
            if !self.memo_sparse.is_empty() {
                for key in from..k {
                    if let Some(v) = self.memo_sparse.remove(&(key as u32)) {
                        self.memo[key] = v;
                    }
                }
                self.memo_sparse.remove(&key);
            }
            self.memo[k] = id;
        } else {
            self.memo_sparse.insert(key, id);
        }
        if fresh {
            self.memo_count += 1;
        }
        Ok(())
    }

    #[inline]
    fn memo_get(&mut self, key: u32) -> Result<(), PickleError> {
        let id = match self.memo.get(key as usize) {
            Some(id) if *id != NO_NODE => *id,
            _ => *self
                .memo_sparse
                .get(&key)
                .ok_or_else(|| self.malformed(format!("memo key {key} was never stored")))?,
        };
        self.push_slot(Slot::Val(id))
    }

    /// `APPEND`, `APPENDS`, `ADDITEMS`: the items from `from` on the stack go straight into
    /// the list or set at `at`.
    fn append_from(&mut self, at: Option<usize>, from: usize) -> Result<(), PickleError> {
        let Some(Slot::Val(list)) = at.and_then(|i| self.stack.get(i)).copied() else {
            return Err(self.malformed("a value was expected on the stack"));
        };
        let Unpickler { nodes, stack, .. } = self;
        let items = &stack[from..];
        match nodes.get_mut(list.0 as usize) {
            Some(Node::List(v) | Node::Set(v)) => {
                // Items after the innermost MARK are values; `APPEND` checked its one.
                v.reserve(items.len());
                v.extend(items.iter().filter_map(|s| match s {
                    Slot::Val(id) => Some(*id),
                    Slot::Mark => None,
                }));
            }
            _ => {
                return Err(
                    self.malformed("APPEND/ADDITEMS to something that is not a list or set")
                );
            }
        }
        Ok(())
    }

    /// `SETITEM`, `SETITEMS`: the pairs from `from` on the stack go straight into the dict
    /// at `at`.
    fn set_items_from(&mut self, at: Option<usize>, from: usize) -> Result<(), PickleError> {
        let Some(Slot::Val(dict)) = at.and_then(|i| self.stack.get(i)).copied() else {
            return Err(self.malformed("a value was expected on the stack"));
        };
        let Unpickler { nodes, stack, .. } = self;
        let flat = &stack[from..];
        if !flat.len().is_multiple_of(2) || flat.iter().any(|s| matches!(s, Slot::Mark)) {
            return Err(self.malformed("SETITEMS with an odd number of items"));
        }
        let pairs = flat.chunks_exact(2).map(|c| match (c[0], c[1]) {
            (Slot::Val(k), Slot::Val(v)) => (k, v),
            _ => (NO_NODE, NO_NODE), // excluded above
        });
        match nodes.get_mut(dict.0 as usize) {
            Some(Node::Dict(v)) => {
                v.reserve(flat.len() / 2);
                v.extend(pairs);
            }
            _ => return Err(self.malformed("SETITEM(S) on something that is not a dict")),
        }
        Ok(())
    }

    /// Runs the opcodes to `STOP`.
    fn run(&mut self) -> Result<NodeId, PickleError> {
        loop {
            let at = self.src.offset();
            let code = self.u8("an opcode")?;
            if let Some(v) = self.step(code, at)? {
                return Ok(v);
            }
        }
    }

    /// One opcode; `Some(root)` at `STOP`.
    #[allow(
        clippy::too_many_lines,
        reason = "one arm per pickle opcode: the dispatch reads best in one place"
    )]
    #[inline]
    fn step(&mut self, code: u8, at: u64) -> Result<Option<NodeId>, PickleError> {
        match code {
            // The opcodes of a snapshot, most frequent first.
            b'h' => {
                let k = self.u8("BINGET")?;
                self.memo_get(u32::from(k))?;
            }
            b'j' => {
                let k = self.u32("LONG_BINGET")?;
                self.memo_get(k)?;
            }
            0x94 => {
                let k = u32::try_from(self.memo_count)
                    .map_err(|_| PickleError::Limit("memo too large".into()))?;
                self.memo_put(k)?;
            }
            b'(' => self.push_slot(Slot::Mark)?,
            0x8c => {
                let n = self.u8("SHORT_BINUNICODE")?;
                let s = self.string(u64::from(n))?;
                self.push(Node::Str(s))?;
            }
            0x8a => {
                let n = self.u8("LONG1")?;
                let v = long(self.src.take(usize::from(n), "LONG1")?)?;
                self.push(Node::Int(v))?;
            }
            b'K' => {
                let v = self.u8("BININT1")?;
                self.push(Node::Int(i128::from(v)))?;
            }
            b'M' => {
                let v = self.u16("BININT2")?;
                self.push(Node::Int(i128::from(v)))?;
            }
            b'J' => {
                let v = self.u32("BININT")? as i32;
                self.push(Node::Int(i128::from(v)))?;
            }
            b'}' => self.push(Node::Dict(Vec::new()))?,
            b']' => self.push(Node::List(Vec::new()))?,
            b'u' => {
                let pos = self.mark()?;
                self.set_items_from(pos.checked_sub(1), pos + 1)?;
                self.stack.truncate(pos);
                self.marks.pop();
            }
            b'e' | 0x90 => {
                let pos = self.mark()?;
                self.append_from(pos.checked_sub(1), pos + 1)?;
                self.stack.truncate(pos);
                self.marks.pop();
            }
            b'a' => {
                let n = self.stack.len();
                if !matches!(self.stack.last(), Some(Slot::Val(_))) {
                    return Err(self.malformed("a value was expected, found a MARK"));
                }
                self.append_from(n.checked_sub(2), n - 1)?;
                self.stack.truncate(n - 1);
            }
            b's' => {
                let n = self.stack.len();
                if n < 3 {
                    return Err(self.malformed("pop from an empty stack"));
                }
                self.set_items_from(Some(n - 3), n - 2)?;
                self.stack.truncate(n - 2);
            }
            0x95 => {
                // FRAME: a length hint only; the bytes follow as ordinary opcodes.
                self.u64("FRAME")?;
            }
            0x80 => {
                let p = self.u8("PROTO")?;
                if !(2..=5).contains(&p) {
                    return Err(PickleError::Protocol(p));
                }
            }
            b'.' => return self.pop().map(Some),
            b'0' => self.pop_any()?,
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
            0x8b => {
                let n = self.u32("LONG4")?;
                let b = self.bytes(u64::from(n), "LONG4")?;
                let v = long(&b)?;
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
            b'g' => {
                let line = self.line()?;
                let k = line
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| self.malformed("GET key"))?;
                self.memo_get(k)?;
            }
            _ => {
                return Err(match refused(code) {
                    Some(name) => PickleError::Refused {
                        name,
                        code,
                        offset: at,
                    },
                    None => PickleError::UnknownOpcode { code, offset: at },
                });
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(b: &[u8]) -> Result<Pickle, PickleError> {
        read_pickle_bytes(b, Limits::default())
    }

    #[test]
    fn reads_protocol4_dict() {
        // pickle.dumps({'a': [1, 2**40, -3, 1.5, None, True, 'x'], 'b': (b'\x01',)}, 4)
        let b: &[u8] = b"\x80\x04\x955\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01\x8a\x06\x00\x00\x00\x00\x00\x01J\xfd\xff\xff\xffG?\xf8\x00\x00\x00\x00\x00\x00N\x88\x8c\x01x\x94e\x8c\x01b\x94C\x01\x01\x94\x85\x94u.";
        let p = read(b).expect("valid pickle");
        let a = p.field(p.root, "a").expect("a");
        let items = p.items(a);
        assert_eq!(items.len(), 7);
        assert_eq!(p.as_int(items[0]), Some(1));
        assert_eq!(p.as_int(items[1]), Some(1 << 40));
        assert_eq!(p.as_int(items[2]), Some(-3));
        assert_eq!(p.as_f64(items[3]), Some(1.5));
        assert_eq!(p.get(items[4]), &Node::None);
        assert_eq!(p.as_bool(items[5]), Some(true));
        assert_eq!(p.as_str(items[6]), Some("x"));
        let b = p.field(p.root, "b").expect("b");
        assert_eq!(p.get(p.items(b)[0]), &Node::Bytes(vec![1]));
    }

    #[test]
    fn memo_shares_mutated_containers() {
        // l = []; pickle.dumps([l, l], 2) after l.append(7): the second item is a BINGET.
        let b: &[u8] = b"\x80\x02]q\x00(]q\x01K\x07ah\x01e.";
        let p = read(b).expect("valid");
        let items = p.items(p.root);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
        assert_eq!(p.items(items[0]).len(), 1);
    }

    #[test]
    fn refuses_code() {
        // pickle.dumps(os.system, 2) starts with GLOBAL ('c').
        let e = read(b"\x80\x02cposix\nsystem\nq\x00.").expect_err("refused");
        assert!(e.to_string().contains("GLOBAL"), "{e}");
        let e = read(b"\x80\x04\x8c\x02os\x8c\x06system\x93.").expect_err("refused");
        assert!(e.to_string().contains("STACK_GLOBAL"), "{e}");
        let e = read(b"\x80\x02N)R.").expect_err("refused");
        assert!(e.to_string().contains("REDUCE"), "{e}");
    }

    #[test]
    fn truncated_and_huge_lengths_are_errors() {
        assert!(matches!(
            read(b"\x80\x04X\xe8\x03\x00\x00abc"),
            Err(PickleError::Truncated { .. })
        ));
        assert!(matches!(
            read(b"\x80\x04X\xff\xff\xff\x7fabc"),
            Err(PickleError::Limit(_))
        ));
        assert!(matches!(
            read(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffab"),
            Err(PickleError::Limit(_))
        ));
        assert!(matches!(read(b""), Err(PickleError::Truncated { .. })));
        assert!(matches!(read(b"\x80\x09N."), Err(PickleError::Protocol(9))));
    }

    #[test]
    fn deep_nesting_is_bounded_not_recursive() {
        let mut b = b"\x80\x02".to_vec();
        b.extend(std::iter::repeat_n(b']', 100_000));
        b.extend(std::iter::repeat_n(b'a', 99_999));
        b.push(b'.');
        let p = read(&b).expect("deep but valid");
        assert_eq!(p.nodes.len(), 100_000);
        let limits = Limits {
            max_stack: 1000,
            ..Limits::default()
        };
        assert!(matches!(
            read_pickle_bytes(&b, limits),
            Err(PickleError::Limit(_))
        ));
        // A self-containing list renders without looping.
        let p = read(b"\x80\x02]q\x00h\x00a.").expect("cycle");
        assert!(p.to_json(p.root, 5).is_array());
    }

    #[test]
    fn progress_can_cancel() {
        let b = vec![b'N'; 3 << 20];
        let mut calls = 0;
        let r = read_pickle(&b[..], Limits::default(), &mut |_| {
            calls += 1;
            calls < 2
        });
        assert!(matches!(r, Err(PickleError::Cancelled)), "{r:?}");
    }

    /// A protocol-4 list of `n` short strings `s0`, `s1`, … (memoized like `pickle.dump`),
    /// its last item a BINGET of the first.
    fn many_strings(n: usize) -> Vec<u8> {
        let mut b = b"\x80\x04]\x94(".to_vec();
        for i in 0..n {
            let t = format!("s{i}");
            b.push(0x8c);
            b.push(t.len() as u8);
            b.extend(t.as_bytes());
            b.push(0x94);
        }
        b.extend(b"h\x01e.");
        b
    }

    #[test]
    fn fields_across_buffer_refills_read_whole() {
        // 200 000 strings: about 1.8 MB, many of them straddling a refill of the buffer.
        let n = 200_000;
        let p = read(&many_strings(n)).expect("valid");
        let items = p.items(p.root);
        assert_eq!(items.len(), n + 1);
        assert_eq!(p.as_str(items[123_457]), Some("s123457"));
        assert_eq!(p.as_str(items[n]), Some("s0"));
        // A string longer than the buffer is gathered as it arrives.
        let long = "x".repeat(BUFFER * 2 + 7);
        let mut b = b"\x80\x04X".to_vec();
        b.extend((long.len() as u32).to_le_bytes());
        b.extend(long.as_bytes());
        b.push(b'.');
        let p = read(&b).expect("long string");
        assert_eq!(p.as_str(p.root).map(str::len), Some(long.len()));
        b.truncate(b.len() - 100);
        assert!(matches!(read(&b), Err(PickleError::Truncated { .. })));
    }

    #[test]
    fn far_memo_keys_cost_one_entry() {
        // LONG_BINPUT 4 000 000 000, then LONG_BINGET of it and of a dense key.
        let b: &[u8] = b"\x80\x04]\x94(K\x07r\x00\x28\x6b\xeej\x00\x28\x6b\xeeh\x00e.";
        let p = read(b).expect("valid");
        let items = p.items(p.root);
        assert_eq!(items.len(), 3);
        assert_eq!(p.as_int(items[1]), Some(7));
        assert_eq!(items[2], p.root);
        assert!(matches!(
            read(b"\x80\x04]\x94j\x00\x28\x6b\xee."),
            Err(PickleError::Malformed { .. })
        ));
    }

    #[test]
    fn cancelling_stops_reading() {
        // Cancelled at the first report: the rest of a 6 MB stream is never read.
        let b = many_strings(600_000);
        let mut consumed = 0usize;
        struct Counted<'a>(&'a [u8], &'a mut usize);
        impl Read for Counted<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.read(buf)?;
                *self.1 += n;
                Ok(n)
            }
        }
        let r = read_pickle(Counted(&b, &mut consumed), Limits::default(), &mut |_| {
            false
        });
        assert!(matches!(r, Err(PickleError::Cancelled)), "{r:?}");
        assert!(consumed <= BUFFER, "{consumed} of {} bytes read", b.len());
    }

    #[test]
    fn sparse_memo_keys_move_into_the_table_when_it_reaches_them() {
        // 70 000 goes to the sparse map, 1..70 000 and 70 001 fill the table past it: a get
        // of 70 000 still finds its value, and MEMOIZE numbers on from the count of keys.
        let put = |b: &mut Vec<u8>, k: u32| {
            b.push(b'r');
            b.extend(k.to_le_bytes());
        };
        let mut b = b"\x80\x04]\x94(K\x05".to_vec();
        put(&mut b, 70_000);
        b.extend(b"0K\x06");
        for k in 1..70_000 {
            put(&mut b, k);
        }
        put(&mut b, 70_001);
        let get = |b: &mut Vec<u8>, k: u32| {
            b.push(b'j');
            b.extend(k.to_le_bytes());
        };
        get(&mut b, 70_000);
        // Written again: still one key, so MEMOIZE gives 70 002.
        b.extend(b"K\x07");
        put(&mut b, 70_000);
        b.push(0x94);
        get(&mut b, 70_000);
        get(&mut b, 70_002);
        b.extend(b"e.");
        let p = read(&b).expect("valid");
        let items: Vec<_> = p.items(p.root).iter().map(|i| p.as_int(*i)).collect();
        assert_eq!(items, [Some(6), Some(5), Some(7), Some(7), Some(7)]);
    }
}
