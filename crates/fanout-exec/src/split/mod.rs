//! GSplit's split parallelism: one mini-batch per step for all workers, split by a partition of
//! the graph into contiguous id ranges (`fanout dataset partition --method metis`), so no vertex
//! is sampled, loaded or computed twice.
//!
//! Every vertex belongs to the worker whose range holds it. [`sample`] samples a step's batch
//! hop by hop: each worker draws the neighbours of the vertices it owns (with the same draws the
//! one-worker sampler makes, see `Sampler::sample_hop`) and asks each owner for the sources it
//! does not own, which also tells the owner that the vertex is reached. [`step`] runs the model
//! layer by layer: before each layer, every worker sends the rows of its vertices that other
//! workers' edges read (the input features at the first layer, hidden rows after), computes the
//! layer for the destinations it owns, and after the backward pass sends the gradients of those
//! rows back to their owners, who add them. The loss is the mean over the step's labelled seeds
//! of all workers and the parameter gradients are summed across workers, so a split step equals
//! the one-worker step on the same batch, up to rounding.
//!
//! What crosses workers is a [`Shuffle`]: source rows (GAT, whose attention needs each source),
//! or GSplit's pre-aggregated partial sums, one per (destination, owner) pair, read through
//! parallel edges so the layers need no change (GraphSAGE, GCN, GIN). GCN's `norm="both"` needs
//! each source's out-degree over all workers' blocks: [`step`] counts them at the owners and
//! rescales rows accordingly.

mod sample;
mod source;
mod step;

pub use sample::{sample, sample_with, SampleWorkspace, Shuffle, SplitBatch, SplitHop};
pub use source::SplitSource;
pub use step::{step, SplitStep};
