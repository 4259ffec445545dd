//! What the measured step needs to repeat the warm-up step's micro-steps (see
//! [`super::repeat`]): each micro-step's buffers, events and end state, and whether the
//! generation may repeat at all; held by the simulation state.

use crate::model::ir::Graph;
use crate::plan::allocator::BoundWindow;

/// What one micro-step of the warm-up step did: its buffers and events (their ranges in the
/// generation's lists) and the state it ended in.
#[derive(Debug, Default)]
pub(super) struct Template {
    pub(super) buffers: std::ops::Range<usize>,
    pub(super) events: std::ops::Range<usize>,
    /// Reference counts of the buffers from the warm-up step's first one to the last one
    /// this micro-step made.
    pub(super) refs: Vec<u32>,
    pub(super) tbuf: Vec<Option<u32>>,
    pub(super) gbuf: Vec<Option<u32>>,
    pub(super) param_grad: Vec<Option<u32>>,
    pub(super) param_pending: Vec<Option<u32>>,
    pub(super) param_seen: Vec<u32>,
    pub(super) param_pending_inplace: Vec<bool>,
    /// `live1` where the micro-step started, its highest value at an allocation in it, and
    /// where it ended.
    pub(super) live1: [u64; 3],
    /// What the micro-step did to the expandable bound (when the generation keeps one).
    pub(super) bound: Option<BoundWindow>,
}

/// The warm-up step's micro-steps, kept for the measured step to repeat.
#[derive(Debug, Default)]
pub(super) struct Repeat {
    /// Whether this generation may repeat at all (one GPU, a graph whose reads follow its
    /// writes).
    pub(super) allowed: bool,
    /// The number of buffers when the warm-up's first micro-step started: ids below it
    /// keep their number in a copy, ids from it on move.
    pub(super) first_buffer: usize,
    /// One template per micro-step of the warm-up, complete (never stopped, every one
    /// started and ended quiescent but for what is kept).
    pub(super) templates: Vec<Template>,
    /// Whether every micro-step of the warm-up was recorded and ended as expected.
    pub(super) complete: bool,
}

impl Repeat {
    /// Whether a generation under these conditions may repeat its micro-steps (the graph
    /// is asked when the warm-up starts, [`reads_after_writes`]).
    pub(super) fn new(single_gpu: bool) -> Repeat {
        Repeat {
            allowed: single_gpu,
            ..Repeat::default()
        }
    }
}

/// Whether every node reads only tensors an earlier node made, or tensors no node makes
/// (whose buffer is never set): then a micro-step writes each tensor's buffer before it
/// reads it, and the buffers a previous micro-step left there are never read.
pub(super) fn reads_after_writes(g: &Graph) -> bool {
    let mut maker = vec![usize::MAX; g.tensors.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        if let Some(m) = maker.get_mut(node.output)
            && *m == usize::MAX
        {
            *m = n;
        }
    }
    g.nodes.iter().enumerate().all(|(n, node)| {
        node.inputs
            .iter()
            .all(|&t| maker.get(t).is_some_and(|&m| m == usize::MAX || m < n))
    })
}
